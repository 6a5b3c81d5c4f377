"""FP8-E4M3 with UE8M0 scales: the deployment's activation, KV-page and indexer-key formats as
fake quantisation on fp32 tensors (PyTorch only: element-wise, no kernel of their own).

Every function returns fp32 values exactly representable in the stored format, so "quantise on
write, dequantise on read" is one call where the value is written (`reference/precision.py`
says where the embedded engine uses which; the patches' FP8 faults read these formats wrongly).

- GEMM inputs (DeepSeek's block-FP8 GEMM): per token and per group of 128 channels, FP8-E4M3
  with a UE8M0 (power-of-two) scale, `fp8_activation`.
- KV rows (SGLang's MODEL1 pages): the nope dims in FP8-E4M3 with one UE8M0 scale per 64, the
  rope dims in bf16, `model1_kv`.
- Indexer keys (SGLang's paged FP8 indexer cache): FP8-E4M3 per key with one fp32 scale
  amax / 448, `indexer_key` (as `indexer.pack_indexer_pages`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

E4M3_MAX = 448.0
ACT_GROUP = 128  # DeepSeek's activation quantisation group (1 x 128, per token)
KV_GROUP = 64  # MODEL1: one UE8M0 scale per 64 nope dims


def ue8m0_scale(amax: torch.Tensor) -> torch.Tensor:
    """The power of two at or above amax / 448 (1 where amax is 0: the group stays 0)."""
    return torch.where(amax > 0, torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX))), 1.0)


def fp8_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [..., C] -> FP8-E4M3 with a UE8M0 scale per `group` consecutive channels of the last
    dim (the last group may be shorter), back to fp32."""
    c = x.shape[-1]
    pad = -c % group
    g = F.pad(x, (0, pad)).unflatten(-1, (-1, group))  # [..., ceil(C/group), group]
    scale = ue8m0_scale(g.abs().amax(-1, keepdim=True))
    q = (g / scale).to(torch.float8_e4m3fn).float() * scale
    return q.flatten(-2)[..., :c]


def fp8_activation(x: torch.Tensor) -> torch.Tensor:
    """GEMM input [..., C]: FP8-E4M3 per token and per 128 channels, UE8M0 scales."""
    return fp8_groups(x, ACT_GROUP)


def model1_kv(kv: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """K=V rows [..., D] as MODEL1 pages hold them: nope dims FP8 (UE8M0 per 64), rope bf16."""
    nope, rope = kv[..., :-rope_dim], kv[..., -rope_dim:]
    return torch.cat((fp8_groups(nope, KV_GROUP), rope.bfloat16().float()), -1)


def indexer_key(k: torch.Tensor) -> torch.Tensor:
    """Indexer keys [..., d] as the paged FP8 cache holds them: E4M3, fp32 scale amax / 448."""
    amax = k.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, 1.0)
    return (k / scale).to(torch.float8_e4m3fn).float() * scale
