"""The commented starter written by `dsv4bisect profile new`.

Without a base it spells out an embedded-engine profile (engine, every patch off, probe, bisect).
With `--from BASE` it extends the base and sets nothing else: every inherited section (the
patches with the base's values, probe, bisect, and for SGLang the model path) is shown as
commented YAML, so the new profile resolves to the base's experiment (same fingerprint) until
a line is uncommented.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsv4bisect.patching.registry import builtin_patches

if TYPE_CHECKING:
    from dsv4bisect.config.schema import Profile

_HEADER = """\
# dsv4bisect profile. Every key is checked: a typo is an error, not a silent default.
# What this resolves to, and where each value comes from:
#   dsv4bisect profile show {file} --resolved --why
# `dsv4bisect profile schema` prints the JSON Schema for your editor.
schema_version: 1
name: {name}
description: ""
"""

_EXTENDS = """\
extends: {base}   # a built-in profile name or a path relative to this file
# Everything below is inherited from {base}, shown commented out: as written, this
# profile is the same experiment as {base} (same fingerprint). To change a value,
# uncomment its section's first line and the lines you change.
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
  tier: {tier}{tier_pad}# ci | smoke | standard | deep
bisect:
  confidence: {confidence}
  parallel: {parallel}
  # How a trial whose only finding is drift (a WARN) counts: auto = like the bad end when the
  # bad end itself only drifts (the bisect is then on drift), like the good end when the bad
  # end loses facts (its answers decide); fail / pass = always like the bad / the good end.
  warn_as: {warn_as}
"""


def starter_profile(name: str, base: str | None, *, file: str | None = None,
                    inherited: Profile | None = None) -> str:
    """The starter text. `file`: how the user names the written file (for the show command in
    its comments); `inherited`: the base profile, loaded, whose values are shown commented."""
    text = _HEADER.format(name=name, file=file or f"{name}.yaml")
    if base:
        text += _EXTENDS.format(base=base)
    else:
        text += _ENGINE
    body = _patches(inherited) + _tail(inherited)
    if base:
        body = _model(inherited) + body
        body = "".join(f"# {line}" if line.strip() and not line.startswith("#") else line
                       for line in body.splitlines(keepends=True))
    return text + body


def _patches(inherited: Profile | None) -> str:
    text = "patches:                 # true/false, or {enabled: true, variant: NAME}\n"
    for patch in builtin_patches().values():
        variants = "/".join(v.name + ("†" if v.fault else "") for v in patch.variants)
        value = "false"
        toggle = inherited.patches.get(patch.name) if inherited is not None else None
        if toggle is not None and toggle.enabled:
            value = "true" if toggle.variant is None else \
                f"{{enabled: true, variant: {toggle.variant}}}"
        text += f"  {patch.name}: {value}   # tier {patch.tier}; variants {variants}\n"
    return text + "# † marks fault variants: they reproduce known failure modes on purpose.\n"


def _tail(inherited: Profile | None) -> str:
    from dsv4bisect.config.schema import BisectSettings, ProbeSettings

    probe = inherited.probe if inherited is not None else ProbeSettings()
    bisect = inherited.bisect if inherited is not None else BisectSettings()
    return _TAIL.format(tier=probe.tier, tier_pad=" " * max(1, 19 - len(probe.tier)),
                        confidence=bisect.confidence, parallel=bisect.parallel,
                        warn_as=bisect.warn_as)


def _model(inherited: Profile | None) -> str:
    if inherited is None or inherited.engine.kind not in ("sglang", "vllm"):
        return ""
    what = "vllm serve's model" if inherited.engine.kind == "vllm" else "--model-path"
    return (f"engine:\n  model: {inherited.engine.model or '/path/to/DeepSeek-V4'}"
            f"   # {what}: the checkpoint directory on this node\n")
