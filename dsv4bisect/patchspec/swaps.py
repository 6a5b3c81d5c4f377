"""The embedded engine's swappable ops, and how a patch declares that it swaps one.

A patch's numerics on the embedded engine are module swaps, as gpt-fast swaps a quantised
linear in (docs/patches.md): the model has a named place for every op a patch can replace,
each holding its stock implementation, and `Transformer.configure` puts in, at each place, what
the patch set's swaps build instead. The model's `forward` never asks which patch is on.

`Op` names the places. Each takes an implementation of one signature (tensor shapes as in
`reference/model.py`; `step` is the model's per-forward `Step`); where it sits in the model:

- MHC_MIXES, `layers.N.hc_attn_mixes` / `hc_ffn_mixes`: the mixing GEMM of an mHC site,
  `(x [T, n·D], fn [M, n·D]) -> [T, M]` fp32.
- ATTENTION, `layers.N.attn.core`: sparse attention over every group's key lists (the split-K
  merge lives here), `(q [N, H, D], lists: [KeyList], sink [H], scale, step) -> [N, H, D]`.
- KV_WRITE, `layers.N.attn.kv_write`: the step's new K=V rows as the cache holds them,
  `(kv [N, D], step, groups) -> kv`.
- KV_READ, `layers.N.attn.kv_read`: a group's key pool as the kernel reads it,
  `(pool [B, P, D], tokens per sequence) -> pool`.
- COMPRESSED_ROPE, `layers.N.attn.compressor.rope`: the compressed entries' rotation table
  (`.cos_sin(positions)`, `.rebased(base)`).
- INDEXER_LOGITS, `layers.N.attn.indexer.logits`: one sequence's indexer scores,
  `(q [T, h, d], w [T, h], k [S, d], n_visible [T], step) -> [T, S]`.
- INDEXER_TOPK, `layers.N.attn.indexer.selection`: `(scores [B, T, S], k, step) -> ids [B, T, k]`.
- WO_A_INPUT, `layers.N.attn.wo_a_input`: the attention output as the wo_a GEMM reads it,
  `(o [N, G, C]) -> o`.
- ROUTED_SCALING, `layers.N.ffn.routed_scaling`: where routed_scaling_factor is applied,
  `.topk(w [T, k])` and `.runner(routed [T, dim])`.
- EXPERT_QUANT, `layers.N.ffn.expert_quant`: the routed experts' format, an `ExpertQuant`.
- EXPERT_CLAMP, `layers.N.ffn.expert_clamp`: the NVFP4 experts' SwiGLU clamp, `limit`, `none`
  or `limit*alpha`.
- HEAD_INPUT, `head_input`: the collapsed final state before the norm and head, `(x) -> x`.
- SPECULATION (the server): the SGLang server arguments that turn speculative decoding on.
- SPEC_VERIFY, `spec_verify` (the scheduler calls it): `(request, drafts, rows [1 + k, V]) ->
  Verdict`, and `.greedy(drafts, rows)`.
- WINDOW_STORE, `window_store` (the scheduler builds it): `(n_slots, window) -> store` with
  `.admit(cache, hit) -> lease` and `lease.release(cache)`.

A swap's `build(site)` returns the implementation for one place of the model, or None where
the patch leaves that place as it is (a fault of the FP8 path at `precision: exact`, a
hash-routing change on a layer that is not hash-routed). Where two patches of a set swap the
same op at one place, the first in registry order takes it (the later one is masked there,
as SGLang's own branch order masks one of two patches); `site.stock` is the stock
implementation, for a swap that builds on it. Importing this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol


class Op(Enum):
    """A place of the embedded engine a patch can swap an implementation into."""

    MHC_MIXES = "mhc_mixes"
    ATTENTION = "attention"
    KV_WRITE = "kv_write"
    KV_READ = "kv_read"
    COMPRESSED_ROPE = "compressed_rope"
    INDEXER_LOGITS = "indexer_logits"
    INDEXER_TOPK = "indexer_topk"
    WO_A_INPUT = "wo_a_input"
    ROUTED_SCALING = "routed_scaling"
    EXPERT_QUANT = "expert_quant"
    EXPERT_CLAMP = "expert_clamp"
    HEAD_INPUT = "head_input"
    SPECULATION = "speculation"
    SPEC_VERIFY = "spec_verify"
    WINDOW_STORE = "window_store"


@dataclass(frozen=True)
class ExpertQuant:
    """How a MoE layer's routed experts compute (`Op.EXPERT_QUANT`): in NVFP4, and then with
    their GEMM inputs quantised to NVFP4 too (W4A4) or not (W4A16)."""

    nvfp4: bool
    act_quant: bool


class Site(Protocol):
    """What a swap's `build` is told about the place it builds for (the engine's `Site`)."""

    op: Op
    layer: int | None  # the decoder layer (MTP layers follow the main ones); None: model-wide
    args: Any  # the model's `ModelArgs`
    precision: str  # deployment | exact
    moe_backend: str  # SGLang's --moe-runner-backend name
    nvfp4_layers: frozenset[int] | None  # the NVFP4 map (None: every main MoE layer)
    patches: Mapping[str, str]  # the whole patch set, name -> variant (registry order)
    stock: Any  # the stock implementation at this place

    @property
    def deployment(self) -> bool: ...


@dataclass(frozen=True)
class Swap:
    """The patch swaps `op`: `build(site)` is the implementation it puts in at each place of
    that op (None: it leaves the place as it is), for `variants` (None: every variant)."""

    op: Op
    build: Callable[[Site], Any]
    variants: tuple[str, ...] | None = None

    def covers(self, variant: str) -> bool:
        return self.variants is None or variant in self.variants


def kernel_settings(attend: Callable[..., Any], split: int | None, partial: str,
                    merge: str, segmented: bool = False) -> Callable[..., Any]:
    """Name the kernel settings an `Op.ATTENTION` implementation runs with, as its `kernel`
    attribute: keys per split-K piece (None: whole lists), the partials' dtype, the merge, and
    whether the stock deployment schedule cuts the lists (`segmented`). `localise`'s op-level
    repro sets one of the bad end's to the good end's to tell the kernel's parts apart."""
    # setattr: a function object's new attribute, which a type checker does not know
    setattr(attend, "kernel", {"split": split, "partial": partial, "merge": merge,  # noqa: B010
                               "segmented": segmented})
    return attend
