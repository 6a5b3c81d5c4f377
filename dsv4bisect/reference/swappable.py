"""The embedded model's swappable places (`patchspec/swaps.py`: the `Op` table): their stock
implementations, and what a patch set puts in at each place instead (`PatchSwaps`).

`Transformer.configure` builds every place from a `PatchSwaps`: the first swap of the set, in
registry order, whose `build` gives an implementation for that place takes it; the others leave
it as it is, and where none does the place keeps its stock implementation, the numerics of the
deployment with no patch on (at `precision: deployment`: SGLang's own kernel choices, FP8 pages
and activations, NVFP4 experts) or of the fp32 model (`exact`). A place holding a tensor
function is a `Swappable` module, named as the op's table says (`layers.3.attn.core`), so a
forward hook sees its inputs and output whichever implementation is in it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dsv4bisect.kernels.fp8 import model1_kv
from dsv4bisect.kernels.indexer import indexer_topk
from dsv4bisect.kernels.mhc_mixes import mhc_mixes_ref, mhc_mixes_split_ref
from dsv4bisect.kernels.sparse_attention import sparse_attention_segmented_ref
from dsv4bisect.patchspec.swaps import ExpertQuant, Op, Swap, kernel_settings
from dsv4bisect.reference.config import (
    NVFP4_UNCLAMPED_BACKENDS,
    NVFP4_W4A16_BACKENDS,
    TRTLLM_BACKENDS,
    ModelArgs,
    Numerics,
)
from dsv4bisect.reference.dispatch import FLASH, fit_mhc_plan, flashmla_segments, mhc_pre_plan

STOCK = "stock"


@dataclass(frozen=True)
class Site:
    """One place of the model, as a swap's `build` sees it (`patchspec.swaps.Site`)."""

    op: Op
    layer: int | None
    args: ModelArgs | None  # None: a place outside the model (the server's speculation)
    precision: str
    moe_backend: str
    nvfp4_layers: frozenset[int] | None
    patches: Mapping[str, str]
    stock: Any

    @property
    def deployment(self) -> bool:
        return self.precision == "deployment"


class Swappable(nn.Module):
    """A place of the model that holds one op's implementation (stock or a patch's) and calls
    it; `source` is `stock` or the `patch:variant` that put it in."""

    def __init__(self, op: Op, impl: Callable[..., Any], source: str = STOCK) -> None:
        super().__init__()
        self.op, self.impl, self.source = op, impl, source

    def forward(self, *args: Any) -> Any:
        return self.impl(*args)

    def extra_repr(self) -> str:
        return f"{self.op.value}: {self.source}"


class PatchSwaps:
    """A patch set's swaps, per op in registry order (`Numerics.patches` is in that order)."""

    def __init__(self, numerics: Numerics, args: ModelArgs | None) -> None:
        self.numerics, self.args = numerics, args
        self._by_op: dict[Op, list[tuple[str, Swap]]] = {}
        if not numerics.patches:
            return
        from dsv4bisect.patching.registry import builtin_patches

        known = builtin_patches()
        for name, variant in numerics.patches.items():
            for swap in known[name].swaps:
                if swap.covers(variant):
                    self._by_op.setdefault(swap.op, []).append((f"{name}:{variant}", swap))

    def build(self, op: Op, stock: Any, layer: int | None = None) -> tuple[Any, str]:
        """What goes in at this place, and who put it there (`stock` or `patch:variant`)."""
        n = self.numerics
        site = Site(op, layer, self.args, n.precision, n.moe_backend, n.nvfp4_layers,
                    n.patches, stock)
        for source, swap in self._by_op.get(op, ()):
            impl = swap.build(site)
            if impl is not None:
                return impl, source
        return stock, STOCK

    def value(self, op: Op, stock: Any, layer: int | None = None) -> Any:
        return self.build(op, stock, layer)[0]

    def module(self, op: Op, stock: Callable[..., Any], layer: int | None = None) -> Swappable:
        impl, source = self.build(op, stock, layer)
        return Swappable(op, impl, source)


# ---- stock implementations ----------------------------------------------------------------------


def stock_mixes(a: ModelArgs, deployment: bool, first: bool) -> Callable[..., torch.Tensor]:
    """The hc_pre mixing GEMM, x [T, n·D], fn [M, n·D] -> [T, M] fp32: one fp32 GEMM; at
    `precision: deployment` split as SGLang's kernel for T tokens of DeepSeek-V4-Flash is
    (`dispatch.mhc_pre_plan` at Flash's n·D, fitted to this model's by `fit_mhc_plan`;
    `first`: the model's (or MTP's) first hc_pre, every later one a fused sublayer boundary)."""
    eps = a.rms_norm_eps
    if not deployment:
        return lambda x, fn: mhc_mixes_ref(x, fn, eps, mode="fp32")

    def dispatched(x: torch.Tensor, fn: torch.Tensor) -> torch.Tensor:
        plan = fit_mhc_plan(mhc_pre_plan(x.shape[0], FLASH.hc_mult, FLASH.hidden_size,
                                         first=first), a.hc_mult, a.hidden_size)
        return mhc_mixes_split_ref(x, fn, eps, n_splits=plan.n_splits, kernel=plan.kernel,
                                   hc_mult=a.hc_mult)

    return dispatched


@dataclass(frozen=True)
class KeyList:
    """One group's key lists for `Op.ATTENTION`: its query rows of the step, its key pool
    flattened [B·P, D], its lists [B·T, K] into that pool (-1 = none), the same lists into each
    sequence's own pool (`local`, what a kernel's schedule sees) and its window rows."""

    rows: slice
    keys: torch.Tensor
    idx: torch.Tensor
    local: torch.Tensor
    window: int


def stock_attention(deployment: bool, ratio: int) -> Callable[..., torch.Tensor]:
    """Sparse attention of every group's key lists, (q [N, H, D], lists, sink [H], scale,
    step) -> [N, H, D]: at `precision: deployment` as SGLang's stock kernel runs it, FlashMLA's
    split-KV schedule over all N rows of the batch cutting each row's list where the
    deployment would (`dispatch.flashmla_segments`); at `exact`, or where no row is cut, one
    fp32 pass per list."""

    def attend(q: torch.Tensor, lists: list[KeyList], sink: torch.Tensor, scale: float,
               step: Any) -> torch.Tensor:
        segments = None
        if deployment:
            width = max(kl.local.shape[1] for kl in lists)
            every = torch.cat([nn.functional.pad(kl.local, (0, width - kl.local.shape[1]),
                                                 value=-1) for kl in lists])  # [N, K]
            window = torch.cat([torch.full((kl.local.shape[0],), kl.window, dtype=torch.int64,
                                           device=q.device) for kl in lists])
            segments = flashmla_segments(every, window, step.token_positions, ratio)
        outs = []
        for kl in lists:
            if segments is not None:
                outs.append(sparse_attention_segmented_ref(
                    q[kl.rows], kl.keys, kl.idx, sink, scale,
                    segments[kl.rows, : kl.idx.shape[1]]))
                continue
            outs.append(step.ops.attention(q[kl.rows], kl.keys, kl.idx.to(torch.int32), sink,
                                           scale, split=None, partial_dtype=torch.float32,
                                           merge="lse"))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    return kernel_settings(attend, None, "float32", "lse", segmented=deployment)


def stock_kv_write(a: ModelArgs, deployment: bool) -> Callable[..., torch.Tensor]:
    """The step's new K=V rows [N, D] as the cache holds them: fp32, or at `precision:
    deployment` written to the FP8 MODEL1 pages and read back."""
    if not deployment:
        return lambda kv, step, groups: kv
    return lambda kv, step, groups: model1_kv(kv, a.qk_rope_head_dim)


def stock_kv_read(pool: torch.Tensor, tokens: int) -> torch.Tensor:
    """A group's key pool [B, P, D] as the attention kernel reads it: as written."""
    return pool


def stock_indexer_logits(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor,
                         n_visible: torch.Tensor, step: Any) -> torch.Tensor:
    """The lightning indexer's scores of one sequence [T, S]: the fp32 torch indexer."""
    return step.ops.indexer(q, w, k, n_visible, mode="fp32")


def stock_indexer_topk(scores: torch.Tensor, k: int, step: Any) -> torch.Tensor:
    """scores [B, T, S] -> the top-k entry ids [B, T, k] (valid first, -1 = none)."""
    B, T = scores.shape[:2]
    return indexer_topk(scores.view(B * T, -1), k).view(B, T, -1)


def stock_wo_a_input(deployment: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """The attention output o [N, G, C] as the `wo_a` GEMM reads it: fp32, or at `precision:
    deployment` the attention kernel's bf16 output (SGLang's bf16 einsum on the weight it
    dequantised from FP8 at load)."""
    if not deployment:
        return lambda o: o
    return lambda o: o.bfloat16().float()


@dataclass(frozen=True)
class RunnerScales:
    """Stock routed scaling: HashTopK's weights as routed, the MoE runner's weighted sum times
    `routed_scaling_factor` (once)."""

    rsf: float

    def topk(self, w: torch.Tensor) -> torch.Tensor:
        return w

    def runner(self, routed: torch.Tensor) -> torch.Tensor:
        return routed * self.rsf


def stock_expert_quant(a: ModelArgs, layer: int, numerics: Numerics) -> ExpertQuant:
    """The routed experts as the deployment computes them: at `precision: deployment` NVFP4 on
    the mapped layers, their GEMM inputs NVFP4 too (W4A4) unless the MoE runner is weight-only
    (Marlin); at `exact` fp32."""
    if not numerics.deployment:
        return ExpertQuant(False, False)
    mapped = numerics.nvfp4_layers is None or layer in numerics.nvfp4_layers
    return ExpertQuant(mapped, numerics.moe_backend not in NVFP4_W4A16_BACKENDS)


def stock_expert_clamp(moe_backend: str) -> str:
    """The SwiGLU clamp of NVFP4 routed experts on this MoE runner: none on the flashinfer
    TRT-LLM path (stock 0.5.13 never sets its clamp) and under `triton` (SGLang's
    cutlass_moe_fp4 calls a plain silu_and_mul), else DeepSeek-V4's limit."""
    unclamped = moe_backend in TRTLLM_BACKENDS or moe_backend in NVFP4_UNCLAMPED_BACKENDS
    return "none" if unclamped else "limit"


def keep_head_input(x: torch.Tensor) -> torch.Tensor:
    return x


class NoWindowStore:
    """Stock: the sliding window's rows live in the request's cache (and so in its prefix-cache
    snapshot); nothing is kept per request slot."""

    def __init__(self, n_slots: int, window: int) -> None:
        del n_slots, window

    def admit(self, cache: Any, hit: bool) -> NoWindowStore:
        return self

    def release(self, cache: Any) -> None:
        return None
