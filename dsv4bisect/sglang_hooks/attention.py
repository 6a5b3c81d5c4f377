"""mma-decode and triton-indexer: SGLang's SM120 attention entry points on dsv4bisect kernels.

`flash_mla_with_kvcache_sm120(**kwargs)` (decode, and on SM120 extend batches up to 11673
tokens) becomes the split-K kernel over SGLang's FP8 "MODEL1" pages
(`dsv4bisect.kernels.sparse_attention.sparse_attention_fp8`): the SWA source and the compressed
("extra") source each split into 64-key chunks, merged by LSE, sink applied after the merge.
`fp8_paged_mqa_logits_torch_sm120(...)` becomes the paged FP8 indexer logits kernel
(`dsv4bisect.kernels.indexer.indexer_logits_paged`). Both keep SGLang's argument and return
contracts and do no host sync, so decode CUDA graphs capture them. On CPU (tests) the kernels'
PyTorch references run instead of the Triton kernels.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from dsv4bisect.patchspec.plan import HookSpec, Plan, Recorder, first_call
from dsv4bisect.sglang_hooks.targets import mla_module

if TYPE_CHECKING:
    import torch

INDEXER_TARGET = "sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120"

# variant -> (partial dtype, merge)
DECODE_VARIANTS = {
    "split-k": ("bfloat16", "lse"),
    "split-k-fp32": ("float32", "lse"),
    "merge-no-rescale": ("bfloat16", "no-rescale"),
}
SPLIT = 64  # list positions per split (the embedded swap of mma-decode uses it too)
KERNELS_ENV = "DSV4BISECT_PLUGIN_KERNELS"  # tests: "triton" runs the kernels interpreted on CPU


def _use_triton(t: torch.Tensor) -> bool:
    """Triton on CUDA tensors; on CPU the kernels' PyTorch references, unless the tests ask
    for the interpreted kernels (TRITON_INTERPRET=1 and DSV4BISECT_PLUGIN_KERNELS=triton)."""
    if t.is_cuda:
        return True
    from dsv4bisect.kernels._triton import interpreter_active, triton_available

    return (triton_available() and interpreter_active()
            and os.environ.get(KERNELS_ENV, "auto") == "triton")


def paged_source(k_cache: torch.Tensor, indices: torch.Tensor, topk_length: torch.Tensor | None,
                 tokens: int) -> Any:
    """SGLang's (k_cache [pages, P, 1, bytes/token] fp8 view with page stride, indices
    [B, s_q, K] (-1 = none), topk_length [B] | None) -> a `PagedKV` of [pages, page_bytes]
    uint8 and [B·s_q, K] int32 row ids with entries past topk_length set to -1."""
    import torch

    from dsv4bisect.kernels.sparse_attention import PagedKV

    pages, page_size = k_cache.shape[0], k_cache.shape[1]
    page_bytes = k_cache.stride(0)
    raw = k_cache.as_strided((pages, page_bytes), (page_bytes, 1)).view(torch.uint8)
    idx = indices.to(torch.int32)
    if topk_length is not None:  # [B] valid lengths; keep the mask on-device (no sync)
        k = idx.shape[-1]
        keep = torch.arange(k, device=idx.device).view(1, 1, k) < topk_length.view(-1, 1, 1)
        idx = torch.where(keep, idx, torch.full_like(idx, -1))
    return PagedKV(raw, idx.reshape(tokens, idx.shape[-1]), page_size)


def sparse_decode(kw: dict[str, Any], partial_dtype: torch.dtype, merge: str
                  ) -> tuple[torch.Tensor, None]:
    """The `flash_mla_with_kvcache_sm120` contract: returns (out [B, s_q, H, head_dim_v] bf16,
    None). SGLang's only caller uses `[0]`; the kernels do not produce the LSE."""
    import torch

    from dsv4bisect.kernels import sparse_attention as sa

    q = kw["q"]  # [B, s_q, H, D]
    B, s_q, H, D = q.shape
    T = B * s_q
    scale = kw.get("softmax_scale") or D ** -0.5
    sources = [paged_source(kw["k_cache"], kw["indices"], kw.get("topk_length"), T)]
    extra, extra_idx = kw.get("extra_k_cache"), kw.get("extra_indices_in_kvcache")
    if extra is not None and extra_idx is not None:
        sources.append(paged_source(extra, extra_idx, kw.get("extra_topk_length"), T))
    sink = kw.get("attn_sink")
    sink = (torch.full((H,), float("-inf"), device=q.device) if sink is None
            else sink.reshape(H).float())
    qt = q.reshape(T, H, D)
    fn = sa.sparse_attention_fp8 if _use_triton(q) else sa.sparse_attention_fp8_ref
    out = fn(qt, sources, sink, float(scale), split=SPLIT, partial_dtype=partial_dtype,
             merge=merge)  # [T, H, D] fp32 (bf16-rounded with bf16 partials)
    head_dim_v = kw.get("head_dim_v", D)
    return out.view(B, s_q, H, D)[..., :head_dim_v].to(torch.bfloat16), None


def paged_logits(q_fp8: torch.Tensor, kvcache_fp8: torch.Tensor, weight: torch.Tensor,
                 seq_lens: torch.Tensor, page_table: torch.Tensor, deep_gemm_metadata: Any,
                 max_seq_len: int, clean_logits: bool = True, *, mode: str) -> torch.Tensor:
    """The `fp8_paged_mqa_logits_torch_sm120` contract: q_fp8 [B, 1, H, 128] e4m3, kvcache
    [pages, 64, 1, 132] (1-byte view), weight [B, H] fp32, seq_lens [B] or [B, 1],
    page_table [B, max_pages] -> logits [B, max_seq_len] fp32, -inf past seq_lens."""
    del deep_gemm_metadata, clean_logits  # SGLang passes None / False on this path
    import torch

    from dsv4bisect.kernels import indexer as ix

    pages = kvcache_fp8 if kvcache_fp8.dtype == torch.uint8 else kvcache_fp8.view(torch.uint8)
    lens = seq_lens.reshape(-1)
    fn = ix.indexer_logits_paged if _use_triton(q_fp8) else ix.indexer_logits_paged_ref
    return fn(q_fp8[:, 0], pages, weight.float(), lens, page_table, int(max_seq_len), mode=mode)


def decode_plan(variant: str, layout: str, rec: Recorder) -> Plan:
    if variant not in DECODE_VARIANTS:
        return Plan("refuse", reason=f"mma-decode has no SGLang hook for variant {variant!r}")
    import torch

    dtype, merge = DECODE_VARIANTS[variant]
    pdt = getattr(torch, dtype)
    target = f"{mla_module(layout)}.flash_mla_with_kvcache_sm120"  # moved in 0.5.16
    mark = first_call(rec, target)

    def hook(**kwargs: Any) -> tuple[torch.Tensor, None]:
        mark()
        return sparse_decode(kwargs, pdt, merge)

    return Plan("install", (HookSpec(target, "replace", hook, on_path=True),),
                notes=("reached only on SM120 GPUs (DeepseekV4AttnBackend's _is_sm120 branch)",))


def indexer_plan(variant: str, layout: str, rec: Recorder) -> Plan:
    if variant not in ("bf16", "fp32"):
        return Plan("refuse", reason=f"triton-indexer has no SGLang hook for variant {variant!r}")
    mark = first_call(rec, INDEXER_TARGET)

    def hook(*args: Any, **kwargs: Any) -> torch.Tensor:
        mark()
        return paged_logits(*args, mode=variant, **kwargs)

    return Plan("install", (HookSpec(INDEXER_TARGET, "replace", hook, on_path=True),),
                notes=("reached only where SGLang selects the torch indexer on SM120 "
                       "(SGLANG_FP8_PAGED_MQA_LOGITS_TORCH, forced on SM120)",))
