"""The deployment's storage and compute formats, as fake quantisation on fp32 tensors.

`precision: deployment` runs the embedded engine at the seed deployment's precision
(`nvidia/DeepSeek-V4-Flash-NVFP4` on SGLang with `--kv-cache-dtype fp8_e4m3`); every format
below is fp32 values exactly representable in the stored format, so "quantise on write,
dequantise on read" is one call at the point of the write. The element-wise FP8 formats are
in `kernels/fp8.py`; the block-FP8 weight is here.

- Dense weights of the attention and of the shared experts: FP8-E4M3 with one UE8M0 scale per
  128 x 128 block (DeepSeek's `weight_block_size`), `fp8_block_weight`. Their GEMM inputs are
  quantised as DeepSeek's block-FP8 GEMM does: per token and per group of 128 input channels,
  FP8-E4M3 with a UE8M0 scale (`kernels.fp8.fp8_activation`).
- KV cache (SGLang's MODEL1 pages): per K=V row the nope dims in FP8-E4M3 with one UE8M0 scale
  per group of 64 (448 nope dims = 7 groups in Flash; the tiny model's 48 = one group of 48),
  the rope dims in bf16 (`kernels.fp8.model1_kv`). Compressed entries live in the same pages.
- Indexer keys (SGLang's paged FP8 indexer cache): FP8-E4M3 per key with one fp32 scale
  amax / 448 (`kernels.fp8.indexer_key`, as `kernels.indexer.pack_indexer_pages`).
- Routed experts: NVFP4 (`kernels.nvfp4`), see `reference.model.MoE.prepare`.
"""

from __future__ import annotations

import torch

from dsv4bisect.reference.quant_formats import fp8_block_dequantize, quantize_fp8_block


def fp8_block_weight(w: torch.Tensor) -> torch.Tensor:
    """fp32 [R, C] -> its FP8 block-scaled value (UE8M0 per 128 x 128 block), as stored."""
    q, s = quantize_fp8_block(w, "ue8m0")
    return fp8_block_dequantize(q, s.float())
