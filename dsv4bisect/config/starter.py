"""The commented starter written by `dsv4bisect profile new`."""

from __future__ import annotations

from dsv4bisect.patching.registry import builtin_patches

_HEADER = """\
# dsv4bisect profile. Every key is checked: a typo is an error, not a silent default.
# `dsv4bisect profile show {name} --resolved --why` prints what this resolves to and where each
# value comes from; `dsv4bisect profile schema` prints the JSON Schema for your editor.
schema_version: 1
name: {name}
description: ""
"""

_EXTENDS = """\
extends: {base}   # a built-in profile name or a path relative to this file
"""

_ENGINE = """\
engine:
  kind: reference          # reference (embedded engine) | sglang | command
  moe_backend: triton      # the MoE runner; trtllm-clamp acts only under flashinfer_trtllm*
  chunked_prefill_size: 2048
  startup_timeout_s: 120
  reference:
    checkpoint: embedded   # embedded (trained, shipped) | random | a checkpoint directory
    device: auto           # auto | cpu | cuda
  # kind: sglang needs `model:` (--model-path) and usually tp, gpus, sglang_version, expert_quant;
  # `pd:` with prefill/decode/router sections disaggregates prefill and decode on one node.
"""

_TAIL = """\
probe:
  tier: smoke              # ci | smoke | standard | deep
bisect:
  confidence: 0.95
  parallel: 1
  warn_as: fail            # WARN (drift only) counts as FAIL in a search unless `pass`
"""


def starter_profile(name: str, base: str | None) -> str:
    text = _HEADER.format(name=name)
    if base:
        text += _EXTENDS.format(base=base)
    else:
        text += _ENGINE
    text += "patches:                 # true/false, or {enabled: true, variant: NAME}\n"
    for patch in builtin_patches().values():
        variants = "/".join(v.name + ("†" if v.fault else "") for v in patch.variants)
        text += f"  {patch.name}: false   # tier {patch.tier}; variants {variants}\n"
    text += "# † marks fault variants: they reproduce known failure modes on purpose.\n"
    return text + _TAIL
