"""Differentiable stand-ins for the inference kernels, used only while training.

The Triton kernels have no backward, and the CPU references are blocked for memory rather than
speed on a GPU. Training needs the same functions with autograd: exact fp32 attention over the
key lists (what `sparse_attention_ref(split=None)` computes) and the indexer logits (the
reference already supports autograd). Patches are never on while training.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4bisect.kernels.indexer import indexer_logits_ref
from dsv4bisect.reference.model import Ops


def train_attention(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sink: torch.Tensor, scale: float,
    *, split: int | None = None, partial_dtype: torch.dtype = torch.float32, merge: str = "lse",
) -> torch.Tensor:
    """Exact softmax attention with a per-head sink over gathered key rows, with autograd.

    q [N, H, D], kv [P, D] (K = V), indices [N, K] (-1 = no key), sink [H] -> [N, H, D].
    """
    if split is not None or merge != "lse":
        raise ValueError("training runs with every patch off (exact attention)")
    valid = indices >= 0  # [N, K]
    # F.embedding, not kv[indices]: its backward sums duplicate rows by sorting, where the
    # indexing backward's atomic adds serialise (every query gathers the same entries; 90 % of
    # a training step's GPU time on an H200).
    rows = F.embedding(indices.clamp(min=0).long(), kv)  # [N, K, D]
    logits = torch.einsum("nhd,nkd->nhk", q, rows) * scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    sink_col = sink.view(1, -1, 1).expand(q.shape[0], -1, 1).to(logits.dtype)
    probs = torch.softmax(torch.cat((logits, sink_col), dim=-1), dim=-1)[..., :-1]
    return torch.einsum("nhk,nkd->nhd", probs, rows)


def training_ops(device: torch.device | None = None) -> Ops:
    """On CUDA the 20-iteration Sinkhorn is compiled: eager it is ~150 tiny kernels per mHC
    site forward and more backward, most of a launch-bound training step."""
    sinkhorn = None
    if device is not None and device.type == "cuda":
        from dsv4bisect.reference.model import hc_split_sinkhorn

        sinkhorn = torch.compile(hc_split_sinkhorn, dynamic=True)
    return Ops(attention=train_attention, indexer=indexer_logits_ref,
               indexer_patched=indexer_logits_ref, sinkhorn=sinkhorn)
