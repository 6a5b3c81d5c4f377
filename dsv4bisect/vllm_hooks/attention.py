"""mma-decode on vLLM: FlashMLA's sparse FP8 decode entry on dsv4bisect's split-K kernel.

vLLM decodes DeepSeek-V4 with FlashMLA (`DeepseekV4FlashMLAAttention._forward_decode`, 0.20.0's
`DeepseekV4MLAAttention`): `flash_mla_with_kvcache(q=, k_cache=, indices=, topk_length=,
attn_sink=, extra_k_cache=, extra_indices_in_kvcache=, extra_topk_length=, head_dim_v=,
softmax_scale=, is_fp8_kvcache=True, out=...)` on FlashMLA's FP8 "MODEL1" pages, the layout
SGLang's SM120 entry takes too, so the hook body is the SGLang one
(`sglang_hooks/attention.sparse_decode`): the SWA and compressed sources in 64-key splits,
merged by LSE. It writes into `out` when given and returns `(out, None)` (vLLM's callers unpack
`out, _`; checked statically, `targets.decode_calls`). A dense call (no `indices`) goes to
FlashMLA unchanged. Reached on GPUs where vLLM picks FlashMLA for V4 (SM90 / SM100); SM12x
defaults to FlashInfer's sparse MLA, where the receipt shows the hook never called. The field
faults of this patch live where the embedded engine models them; vLLM refuses them.
"""

from __future__ import annotations

from typing import Any

from dsv4bisect.patchspec.plan import HookSpec, Plan, Recorder
from dsv4bisect.patchspec.spec import EngineContext
from dsv4bisect.vllm_hooks import targets as tg

VARIANTS = ("split-k", "split-k-fp32", "merge-no-rescale")


def decode(original: Any, variant: str, **kw: Any) -> Any:
    """The FlashMLA contract on the split-K kernel; `out` [B, s_q, H, Dv] filled when given."""
    if kw.get("indices") is None or not kw.get("is_fp8_kvcache", False):
        return original(**kw)
    import torch

    from dsv4bisect.sglang_hooks.attention import DECODE_VARIANTS, sparse_decode

    dtype, merge = DECODE_VARIANTS[variant]  # the partials' dtype by name (torch-free table)
    result, _ = sparse_decode(kw, getattr(torch, dtype), merge)
    out = kw.get("out")
    if out is None:
        return result, None
    out.copy_(result.view(out.shape))
    return out, None


def inert(variant: str, ctx: EngineContext) -> str | None:
    """Where vLLM does not decode V4 with FlashMLA the hooked entry is never called."""
    if ctx.gpu_arch == "sm120":
        return ("vLLM decodes DeepSeek-V4 with FlashInfer's sparse MLA on SM12x "
                "(_select_dsv4_attn_cls); the hooked FlashMLA entry runs on SM90 / SM100")
    return None


def plan(variant: str, layout: str, rec: Recorder) -> Plan:
    if variant not in VARIANTS:
        return Plan("refuse", reason=f"mma-decode:{variant} is a field fault the embedded "
                    "engine models; it has no vLLM hook")
    (site,) = tg.decode_sites(layout)

    def around(original: Any, *args: Any, **kwargs: Any) -> Any:
        if args:  # vLLM's V4 callers pass keywords only; anything else is not this path
            return original(*args, **kwargs)
        if kwargs.get("indices") is not None:
            rec.called(site.target)
        return decode(original, variant, **kwargs)

    return Plan("install", (HookSpec(site.target, "around", around, True),), notes=(
        "reached where vLLM decodes V4 with FlashMLA (SM90 / SM100); SM12x defaults to "
        "FlashInfer's sparse MLA",))
