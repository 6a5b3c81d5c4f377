"""A faithful small DeepSeek-V4 in fp32 PyTorch (one readable file, gpt-fast style).

Module names equal DeepSeek's checkpoint names, so `state_dict()` keys are the tensor names of a
DeepSeek-V4 checkpoint (`embed.weight`, `layers.3.attn.compressor.ape`, `layers.0.ffn.gate.tid2eid`,
`layers.5.ffn.experts.7.w1.weight`, `mtp.0.e_proj.weight`, ...).

Per token: embed -> hc_mult identical residual streams -> per layer two mHC sites (attention, MoE)
-> hc_head -> RMSNorm -> head. Attention is MQA (one shared K=V head) with a per-head sink over a
compact key list per query: the layer's visible compressed entries (CSA: the lightning indexer's
top-k; HCA: all of them) followed by the sliding window. The kernels in `dsv4bisect.kernels` do
the attention, indexer logits and mHC mixes (PyTorch references on CPU, Triton on CUDA). Every op
a patch can replace is a named place of the model holding its implementation
(`reference/swappable.py`); `configure` puts in what a patch set's swaps build there, and no
`forward` asks which patch is on (docs/patches.md).
Shapes: T tokens of one forward call, H heads, D head_dim, n = hc_mult streams.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dsv4bisect.kernels.fp8 import fp8_activation, indexer_key, model1_kv
from dsv4bisect.kernels.indexer import indexer_logits_ref
from dsv4bisect.kernels.mhc_mixes import mhc_mixes_ref
from dsv4bisect.kernels.nvfp4 import E2M1_MAX, E4M3_MAX, default_global_scale, nvfp4_fake_quant
from dsv4bisect.kernels.sparse_attention import sparse_attention_ref
from dsv4bisect.patchspec.swaps import Op
from dsv4bisect.reference.cache import CompressorState, LayerCache, ModelCache, MTPState
from dsv4bisect.reference.config import CSA_RATIO, ModelArgs, Numerics, RopeScaling
from dsv4bisect.reference.precision import fp8_block_weight
from dsv4bisect.reference.speculative import Verification
from dsv4bisect.reference.swappable import (
    KeyList,
    NoWindowStore,
    PatchSwaps,
    RunnerScales,
    keep_head_input,
    stock_attention,
    stock_expert_clamp,
    stock_expert_quant,
    stock_indexer_logits,
    stock_indexer_topk,
    stock_kv_read,
    stock_kv_write,
    stock_mixes,
    stock_wo_a_input,
)
from dsv4bisect.reference.taps import active, tap

# ---- kernels per device -------------------------------------------------------------------------


@dataclass(frozen=True)
class Ops:
    """Kernel entry points: the PyTorch references on CPU, the Triton wrappers on CUDA.
    Training swaps in differentiable versions (`reference/training/ops.py`)."""

    attention: Callable[..., torch.Tensor]
    indexer: Callable[..., torch.Tensor]  # the stock fp32 indexer logits
    indexer_patched: Callable[..., torch.Tensor]  # the triton-indexer patch's logits
    sinkhorn: Callable[..., tuple[torch.Tensor, ...]] | None = None  # None: hc_split_sinkhorn

    @classmethod
    def for_device(cls, device: torch.device) -> Ops:
        if device.type == "cuda":
            from dsv4bisect.kernels.indexer import indexer_logits
            from dsv4bisect.kernels.sparse_attention import sparse_attention

            return cls(sparse_attention, indexer_logits_ref, indexer_logits)
        return cls(sparse_attention_ref, indexer_logits_ref, indexer_logits_ref)


# ---- rotary embedding ---------------------------------------------------------------------------


class Rope:
    """Interleaved RoPE (pairs 2i, 2i+1) on the last `rope_dim` dims; YaRN interpolation of the
    frequencies when `scaling` is set (compressed layers), with no attention mscale."""

    def __init__(self, rope_dim: int, base: float, scaling: RopeScaling | None) -> None:
        self.rope_dim, self.base, self.scaling = rope_dim, base, scaling
        cpu = torch.device("cpu")  # also when the model is built under torch.device("meta")
        dims = torch.arange(0, rope_dim, 2, dtype=torch.float32, device=cpu)
        freqs = 1.0 / (base ** (dims / rope_dim))
        if scaling is not None:
            low, high = _yarn_range(scaling, rope_dim, base)
            ramp = ((dims / 2 - low) / (high - low)).clamp(0, 1)
            smooth = 1.0 - ramp  # 1: keep the frequency (high-frequency dims), 0: divide by factor
            freqs = freqs / scaling.factor * (1.0 - smooth) + freqs * smooth
        self.inv_freq = freqs  # [rope_dim / 2]

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] -> cos, sin [T, rope_dim / 2] fp32."""
        angles = torch.outer(positions.float(), self.inv_freq.to(positions.device))
        return angles.cos(), angles.sin()

    def rebased(self, base: float) -> Rope:
        """The same table (dims, YaRN) at another base."""
        return Rope(self.rope_dim, base, self.scaling)


def _yarn_range(s: RopeScaling, dim: int, base: float) -> tuple[float, float]:
    def dim_of(rotations: float) -> float:
        return (
            dim
            * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi))
            / (2 * math.log(base))
        )

    low = max(math.floor(dim_of(s.beta_fast)), 0)
    high = min(math.ceil(dim_of(s.beta_slow)), dim - 1)
    return float(low), float(high) + (0.001 if high == low else 0.0)


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, inverse: bool = False
) -> torch.Tensor:
    """Rotate the last 2·cos.shape[-1] dims of x [T, D] or [T, H, D]; cos/sin [T, rd/2]."""
    rd = 2 * cos.shape[-1]
    if x.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    if inverse:
        sin = -sin
    pairs = x[..., -rd:].unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    rot = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return torch.cat((x[..., :-rd], rot), dim=-1)


# ---- small building blocks ----------------------------------------------------------------------


def _param(*shape: int) -> nn.Parameter:
    """Uninitialised frozen storage (inference only): a checkpoint or the seeded init fills it."""
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class Linear(nn.Module):
    """y = x·Wᵀ with W [out, in] (no bias in DeepSeek-V4); no init of its own.

    `fp8` (set by `Transformer.configure` at `precision: deployment`) makes it a block-FP8
    GEMM: the FP8 block-scaled weight `fp8_weight` (the stored value, or the weight quantised
    at configure) and FP8 inputs per token and 128 channels (`forward`). The attention's `wo_a`
    is a grouped einsum that reads `value()` and quantises its own input (`wo_a_input`). The
    parameter stays the loaded value, so configuring again with another precision starts from
    it."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.in_features, self.out_features = n_in, n_out
        self.weight = _param(n_out, n_in)
        self.fp8_weight: torch.Tensor | None = None

    def value(self) -> torch.Tensor:
        """The weight the GEMM uses [out, in]."""
        return self.weight if self.fp8_weight is None else self.fp8_weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp8_weight is None:
            return F.linear(x, self.weight)
        return F.linear(fp8_activation(x), self.fp8_weight)


class Embedding(nn.Module):
    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.weight = _param(vocab, dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _param(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight


_linear = Linear


@dataclass(frozen=True)
class Step:
    """What every layer needs about one forward call: `batch` sequences of T tokens each, at
    positions start..start+T. Token-wise ops see the batch flattened ([batch·T, ...]);
    sequence-wise ops (compressors, indexer, key lists) run per sequence.

    A ragged step (`Transformer.forward_ragged`: sequences of different lengths at different
    positions) has `parts`: (first row, Step of that group) in row order, each part a group of
    `part.batch` sequences at one position; its own token-wise fields cover all N rows and
    `positions` / `batch` are unused. Token-wise ops (embedding, mHC, norms, projections, MoE,
    head) run once on all N rows; the key pools, compressor windows and indexer per part."""

    tokens: torch.Tensor  # [N = batch·T] int64
    positions: torch.Tensor  # [T] int64, shared by every sequence of the batch
    main_rope: tuple[torch.Tensor, torch.Tensor]  # [N, rd/2]; SWA-only layers, no YaRN
    compress_rope: tuple[torch.Tensor, torch.Tensor]  # [N, rd/2]; compressed layers + YaRN
    token_positions: torch.Tensor  # [N] int64: each row's position in its sequence
    numerics: Numerics
    ops: Ops
    batch: int = 1
    train: TrainHooks | None = None
    parts: tuple[tuple[int, Step], ...] = ()
    # speculative verification: each attention layer records here (layer id -> its new K=V
    # rows and compressor / indexer projections, [B, T, ...]) what it appended to the caches,
    # so a cache can later be advanced by a prefix of the rows (`speculative.commit_rows`)
    trace: dict[int, Any] | None = None

    def groups(self, caches: list[Any]) -> list[tuple[int, Step, list[Any]]]:
        """(first row, the group's Step, its sequences' caches) per group, in row order."""
        if not self.parts:
            return [(0, self, caches)]
        out, c = [], 0
        for row, part in self.parts:
            out.append((row, part, caches[c : c + part.batch]))
            c += part.batch
        if c != len(caches):
            raise ValueError(f"a step of {c} sequences got {len(caches)} caches")
        return out


@dataclass
class TrainHooks:
    """Training-only behaviour, collected while the forward runs (see reference/training/)."""

    dense_csa: bool = False  # CSA layers attend every visible entry (indexer warm-up)
    dense_experts: bool = False  # every routed expert on every token, weighted (fewer launches)
    indexer_losses: list[torch.Tensor] | None = None  # KL(attention over entries || indexer)
    expert_loads: dict[int, torch.Tensor] | None = None  # layer -> tokens routed per expert


# ---- mHC ----------------------------------------------------------------------------------------


def hc_split_sinkhorn(
    mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, n: int, iters: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mixes [T, (2+n)·n] -> pre [T, n], post [T, n], comb [T, n, n] (doubly stochastic)."""
    T = mixes.shape[0]
    pre = torch.sigmoid(mixes[:, :n] * scale[0] + base[:n]) + eps
    post = 2.0 * torch.sigmoid(mixes[:, n : 2 * n] * scale[1] + base[n : 2 * n])
    logits = mixes[:, 2 * n :].view(T, n, n) * scale[2] + base[2 * n :].view(n, n)
    # In place for speed at inference; out of place when autograd needs the intermediates.
    inplace = not (torch.is_grad_enabled() and mixes.requires_grad)

    def normalise(c: torch.Tensor, dim: int) -> torch.Tensor:
        total = c.sum(dim, keepdim=True) + eps
        return c.div_(total) if inplace else c / total

    # c[j, k, t]: tokens contiguous, so each normalisation is n vector adds and a divide
    c = torch.softmax(logits, dim=-1)
    c = (c.add_(eps) if inplace else c + eps).permute(1, 2, 0).contiguous()
    c = normalise(c, 0)  # columns, then (rows, columns) x iters-1
    for _ in range(iters - 1):
        c = normalise(normalise(c, 1), 0)
    return pre, post, c.permute(2, 0, 1)


def hc_pre(
    h: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    a: ModelArgs,
    mix: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    sinkhorn: Callable[..., tuple[torch.Tensor, ...]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h [T, n, dim] -> collapsed input x [T, dim], post [T, n], comb [T, n, n]. `mix` is the
    site's mixing GEMM (x [T, n·D], fn -> [T, (2+n)·n] fp32: the block's `hc_*_mixes` place);
    `sinkhorn` replaces `hc_split_sinkhorn` (training uses a compiled one on CUDA)."""
    mixes = mix(h.flatten(1), fn)  # [T, (2+n)·n]
    pre, post, comb = (sinkhorn or hc_split_sinkhorn)(
        mixes, scale, base, a.hc_mult, a.hc_sinkhorn_iters, a.hc_eps
    )
    return (pre[..., None] * h).sum(1), post, comb


def hc_post(
    o: torch.Tensor, h: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
) -> torch.Tensor:
    """H'_k = post_k·o + Σ_j comb[j, k]·H_j. o [T, dim], h [T, n, dim] -> [T, n, dim]."""
    return torch.baddbmm(post[..., None] * o[:, None, :], comb.transpose(1, 2), h)


def hc_head(
    h: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, a: ModelArgs
) -> torch.Tensor:
    """Final collapse of the streams (fp32 mixes, no post/comb). h [T, n, dim] -> [T, dim]."""
    mixes = mhc_mixes_ref(h.flatten(1), fn, a.rms_norm_eps, mode="fp32")  # [T, n]
    pre = torch.sigmoid(mixes * scale + base) + a.hc_eps
    return (pre[..., None] * h).sum(1)


# ---- compressed KV ------------------------------------------------------------------------------


class Compressor(nn.Module):
    """Softmax-gated pooling of `ratio` tokens into one entry (per channel, gate + `ape`), then
    RMSNorm and RoPE at the window's first position. Ratio 4 (CSA) uses the overlapping scheme:
    each token emits two halves; entry w pools Ca of window w-1 and Cb of window w (8 slots)."""

    def __init__(self, a: ModelArgs, head_dim: int, ratio: int, cache: str = "kv") -> None:
        super().__init__()
        self.ratio, self.head_dim = ratio, head_dim
        self.cache = cache  # where entries are written: `kv` (MODEL1 pages) or `indexer`
        self.rope_dim = a.qk_rope_head_dim
        self.overlap = ratio == CSA_RATIO
        coff = 2 if self.overlap else 1
        self.wkv = _linear(a.hidden_size, coff * head_dim)
        self.wgate = _linear(a.hidden_size, coff * head_dim)
        self.ape = _param(ratio, coff * head_dim)
        self.norm = RMSNorm(head_dim, a.rms_norm_eps)
        # the rotation of its entries (compressed layers' base + YaRN); a KV compressor's is
        # a swappable place (Op.COMPRESSED_ROPE), the indexer's is not
        self.stock_rope = Rope(a.qk_rope_head_dim, a.compress_rope_theta, a.rope_scaling)
        self.rope = self.stock_rope

    def install(self, swaps: PatchSwaps, layer: int) -> None:
        if self.cache == "kv":
            self.rope = swaps.value(Op.COMPRESSED_ROPE, self.stock_rope, layer)

    def new_state(self, device: torch.device) -> CompressorState:
        return CompressorState.create(self.ratio, self.wkv.out_features, self.head_dim, device)

    def project(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token-wise part: x [N, dim], positions [N] -> kv, gate score [N, coff·d]."""
        return self.wkv(x), self.wgate(x) + self.ape[positions % self.ratio]

    def forward(self, x: torch.Tensor, step: Step, states: list[CompressorState]) -> None:
        """x [B, T, dim]: the next T tokens of B sequences whose states are at the same point.
        Append each sequence's entries of every window these tokens complete to its state."""
        B, T = x.shape[:2]
        kv, score = self.project(x.reshape(B * T, -1), step.positions.repeat(B))
        self.absorb(kv.view(B, T, -1), score.view(B, T, -1), step, states)

    def absorb(
        self, kv: torch.Tensor, score: torch.Tensor, step: Step, states: list[CompressorState]
    ) -> None:
        """Sequence-wise part: kv, score [B, T, coff·d] of one group (`step`) -> the entries
        of every window these tokens complete, appended to each sequence's state."""
        r, B = self.ratio, kv.shape[0]
        kv = torch.cat((torch.stack([s.pending_kv for s in states]), kv), 1)  # from n_entries·r
        score = torch.cat((torch.stack([s.pending_score for s in states]), score), 1)
        n_win = kv.shape[1] // r
        for b, state in enumerate(states):  # copies (< r rows): a view would keep [B, T, ·]
            state.pending_kv = kv[b, n_win * r :].clone()
            state.pending_score = score[b, n_win * r :].clone()
        if n_win == 0:
            return
        kv = kv[:, : n_win * r].view(B, n_win, r, -1)
        score = score[:, : n_win * r].view(B, n_win, r, -1)
        if self.overlap:
            kv, score = self._overlap(kv, score, states)  # [B, n_win, 2r, d]
        pooled = (kv * torch.softmax(score, dim=2)).sum(2)  # [B, n_win, d]
        first = states[0].n_entries
        positions = (first + torch.arange(n_win, device=kv.device)) * r
        cos, sin = self.rope.cos_sin(positions)
        entries = apply_rope(self.norm(pooled).transpose(0, 1), cos, sin)  # [n_win, B, d]
        if step.numerics.deployment:  # written to the FP8 cache, read back from it
            entries = (model1_kv(entries, self.rope_dim) if self.cache == "kv"
                       else indexer_key(entries))
        tap(self, "compressor.entries", entries.transpose(0, 1), at=first)  # [B, n_win, d]
        for b, state in enumerate(states):
            state.entries.append(entries[:, b])

    def _overlap(
        self, kv: torch.Tensor, score: torch.Tensor, states: list[CompressorState]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, n_win, r, 2d] -> slots [B, n_win, 2r, d]: Ca of the previous window, then Cb."""
        d, B = self.head_dim, kv.shape[0]
        if states[0].prev_kv is None:  # window 0 of the sequences: its Ca slots weigh 0
            prev_kv = kv.new_zeros(B, 1, self.ratio, d)
            prev_score = score.new_full((B, 1, self.ratio, d), float("-inf"))
        else:
            prev_kv = torch.stack([s.prev_kv for s in states])[:, None]
            prev_score = torch.stack([s.prev_score for s in states])[:, None]
        for b, state in enumerate(states):
            state.prev_kv, state.prev_score = kv[b, -1, :, :d].clone(), score[b, -1, :, :d].clone()
        ca_kv = torch.cat((prev_kv, kv[:, :-1, :, :d]), 1)
        ca_score = torch.cat((prev_score, score[:, :-1, :, :d]), 1)
        return torch.cat((ca_kv, kv[..., d:]), 2), torch.cat((ca_score, score[..., d:]), 2)


class Indexer(nn.Module):
    """Lightning indexer of a CSA layer: its own ratio-4 compressor at index_head_dim, and
    score[t, s] = Σ_h w[t, h]·relu(q[t, h]·k[s]) over visible entries -> top-k entry ids."""

    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.topk = a.index_n_heads, a.index_head_dim, a.index_topk
        self.wq_b = _linear(a.q_lora_rank, a.index_n_heads * a.index_head_dim)
        self.weights_proj = _linear(a.hidden_size, a.index_n_heads)
        self.compressor = Compressor(a, a.index_head_dim, CSA_RATIO, cache="indexer")

    def install(self, swaps: PatchSwaps, layer: int) -> None:
        """Its swappable places: the scores of every visible entry (`logits`) and the choice of
        the top-k among them (`selection`)."""
        self.logits = swaps.module(Op.INDEXER_LOGITS, stock_indexer_logits, layer)
        self.selection = swaps.module(Op.INDEXER_TOPK, stock_indexer_topk, layer)

    def project(self, x: torch.Tensor, qr: torch.Tensor, step: Step) -> dict[str, torch.Tensor]:
        """Token-wise part over every row of the step: x [N, dim], qr [N, q_lora] -> the
        compressor's kv / score [N, 2·d], the queries q [N, H_I, d] (RoPE'd), weights w
        [N, H_I]."""
        kv, score = self.compressor.project(x, step.token_positions)
        q = self.wq_b(qr).view(-1, self.n_heads, self.head_dim)
        q = apply_rope(q, *step.compress_rope)
        w = self.weights_proj(x) * (self.head_dim**-0.5 * self.n_heads**-0.5)
        return {"kv": kv, "score": score, "q": q, "w": w}

    def scores(
        self, x: torch.Tensor, qr: torch.Tensor, step: Step, states: list[CompressorState]
    ) -> torch.Tensor | None:
        """B sequences of one group: x [B, T, dim], qr [B, T, q_lora] -> scores [B, T, S]
        fp32 (-inf where not yet visible), or None while no entry exists. Appends this chunk's
        entries."""
        B, T = x.shape[:2]
        p = self.project(x.reshape(B * T, -1), qr.reshape(B * T, -1), step)
        return self.group_scores({k: v.unflatten(0, (B, T)) for k, v in p.items()}, step, states)

    def group_scores(
        self, p: dict[str, torch.Tensor], step: Step, states: list[CompressorState]
    ) -> torch.Tensor | None:
        """Sequence-wise part: `project`'s tensors of one group as [B, T, ...] -> scores
        [B, T, S] (None while no entry exists); appends the group's new entries."""
        self.compressor.absorb(p["kv"], p["score"], step, states)
        S = states[0].n_entries
        if S == 0:
            return None
        n_visible = torch.clamp((step.positions + 1) // CSA_RATIO, max=S)
        q, w = p["q"], p["w"]
        return torch.stack([  # [B, T, S]; the kernels take one sequence at a time
            self.logits(q[b], w[b], states[b].entries.view(), n_visible, step)
            for b in range(q.shape[0])
        ])

    def forward(
        self, p: dict[str, torch.Tensor], step: Step, states: list[CompressorState]
    ) -> torch.Tensor:
        """One group's `project` tensors as [B, T, ...] -> [B, T, index_topk] entry ids, valid
        first, -1 where fewer entries are visible; appends the group's new entries."""
        scores = self.group_scores(p, step, states)
        B, T = p["q"].shape[:2]
        tap(self, "indexer.scores", scores)  # [B, T, S] or None
        if scores is None:
            return torch.full((B, T, self.topk), -1, dtype=torch.int64, device=p["q"].device)
        ids = self.selection(scores, self.topk, step)
        tap(self, "indexer.topk", ids)  # [B, T, topk] entry ids
        return ids


def key_lists(
    positions: torch.Tensor,
    window: int,
    window_start: int,
    comp_row0: int,
    n_comp: torch.Tensor,
    comp_ids: torch.Tensor | None,
) -> torch.Tensor:
    """Compact key lists [..., T, K] of pool rows: the query's compressed entries first (comp_ids
    [..., T, C], valid first; None = entries 0..n_comp-1), then its window tokens oldest first
    (pool row = position - window_start), then -1. positions [T]; n_comp [..., T]."""
    n_win = torch.clamp(positions + 1, max=window)  # [T]
    total = n_comp + n_win
    K = int(total.max())
    j = torch.arange(K, device=positions.device)
    nc = n_comp[..., None]
    if comp_ids is None:
        comp_rows = comp_row0 + j
    else:
        ids = F.pad(comp_ids, (0, max(0, K - comp_ids.shape[-1])), value=-1)[..., :K]
        comp_rows = comp_row0 + ids
    win_rows = (positions - n_win + 1 - window_start)[:, None] + (j - nc)
    out = torch.where(j < total[..., None], win_rows, -1)
    return torch.where(j < nc, comp_rows, out)


def indexer_distillation(
    q: torch.Tensor, entries: torch.Tensor, scores: torch.Tensor, n_visible: torch.Tensor
) -> torch.Tensor:
    """KL(main attention over compressed entries || indexer), the lightning indexer's training
    signal (DeepSeek-V3.2): the target is the heads' mean attention distribution over the
    visible entries (detached); scores [B, T, S] are the indexer's logits. Mean over queries
    that see at least one entry. q [B, T, H, D], entries [B, S, D], n_visible [T]."""
    S = scores.shape[-1]
    visible = torch.arange(S, device=q.device)[None, :] < n_visible[:, None]  # [T, S]
    rows = visible.any(1)
    if not bool(rows.any()):
        return scores.new_zeros(())
    vis = visible[rows]  # [T', S]
    with torch.no_grad():
        logits = torch.einsum("bthd,bsd->bths", q[:, rows], entries[:, :S]) * q.shape[-1] ** -0.5
        logits = logits.masked_fill(~vis[None, :, None, :], float("-inf"))
        target = torch.softmax(logits, dim=-1).mean(2)  # [B, T', S]
    log_q = torch.log_softmax(scores[:, rows].masked_fill(~vis, float("-inf")), dim=-1)
    kl = target * (torch.log(target.clamp_min(1e-12)) - log_q.clamp_min(-1e4))
    return kl.masked_fill(~vis, 0.0).sum(-1).mean()


# ---- attention ----------------------------------------------------------------------------------


class Attention(nn.Module):
    """MQA with q low-rank path, per-head sink, sliding window ∪ compressed entries, V = K."""

    def __init__(self, a: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.a, self.layer_id = a, layer_id
        self.ratio, self.kind = a.ratio(layer_id), a.layer_kind(layer_id)
        H, D = a.num_attention_heads, a.head_dim
        self.wq_a = _linear(a.hidden_size, a.q_lora_rank)
        self.q_norm = RMSNorm(a.q_lora_rank, a.rms_norm_eps)
        self.wq_b = _linear(a.q_lora_rank, H * D)
        self.wkv = _linear(a.hidden_size, D)
        self.kv_norm = RMSNorm(D, a.rms_norm_eps)
        self.wo_a = _linear(H * D // a.o_groups, a.o_groups * a.o_lora_rank)
        self.wo_b = _linear(a.o_groups * a.o_lora_rank, a.hidden_size)
        self.attn_sink = _param(H)
        self.compressor = Compressor(a, D, self.ratio) if self.ratio else None
        self.indexer = Indexer(a) if self.kind == "csa" else None
        self.install(PatchSwaps(Numerics(), a))

    def install(self, swaps: PatchSwaps) -> None:
        """Its swappable places: the new K=V rows as the cache holds them (`kv_write`), the key
        pool as the kernel reads it (`kv_read`), the sparse attention (`core`) and the input
        of the wo_a GEMM (`wo_a_input`); its compressors' and indexer's."""
        a, layer, deploy = self.a, self.layer_id, swaps.numerics.deployment
        self.kv_write = swaps.module(Op.KV_WRITE, stock_kv_write(a, deploy), layer)
        self.kv_read = swaps.module(Op.KV_READ, stock_kv_read, layer)
        self.core = swaps.module(Op.ATTENTION, stock_attention(deploy, self.ratio), layer)
        self.wo_a_input = swaps.module(Op.WO_A_INPUT, stock_wo_a_input(deploy), layer)
        if self.compressor is not None:
            self.compressor.install(swaps, layer)
        if self.indexer is not None:
            self.indexer.install(swaps, layer)

    def new_cache(self, device: torch.device) -> LayerCache:
        empty = torch.empty(0, self.a.head_dim, dtype=torch.float32, device=device)
        comp = self.compressor.new_state(device) if self.compressor is not None else None
        index = self.indexer.compressor.new_state(device) if self.indexer is not None else None
        return LayerCache(empty, 0, comp, index)

    def forward(
        self, x: torch.Tensor, step: Step, cache: LayerCache | list[LayerCache]
    ) -> torch.Tensor:
        """x [N, dim] (normed; the step's rows, one cache per sequence) -> [N, dim]; appends to
        the caches. Projections run once over all N rows; each group of sequences (one per
        request in a ragged step) gets its own key pools, compressor windows, indexer and
        attention call."""
        a, N = self.a, x.shape[0]
        H, D = a.num_attention_heads, a.head_dim
        caches = cache if isinstance(cache, list) else [cache]
        cos, sin = step.compress_rope if self.ratio else step.main_rope
        qr = self.q_norm(self.wq_a(x))  # [N, q_lora]; also the indexer's query input
        q = self.wq_b(qr).view(N, H, D)
        q = apply_rope(
            q * torch.rsqrt(q.square().mean(-1, keepdim=True) + a.rms_norm_eps), cos, sin
        )
        tap(self, "attn.q", q)  # [N, H, D]
        kv = apply_rope(self.kv_norm(self.wkv(x)), cos, sin)  # [N, D]
        groups, lists = step.groups(caches), []
        kv = self.kv_write(kv, step, groups)  # the new rows as the cache holds them
        tap(self, "attn.kv_write", kv)  # [N, D]
        proj = self._project(x, qr, step)
        # per group of sequences: its key pool [B, P, D], its lists [B·T, K] into the pool
        # flattened, and each row's window part of the pool (the stock kernel's schedule)
        for g, (row, part, group_caches) in enumerate(groups):
            end = groups[g + 1][0] if g + 1 < len(groups) else N
            B, rows = part.batch, slice(row, end)
            T = (end - row) // B
            mine = {k: {n: t[rows].unflatten(0, (B, T)) for n, t in v.items()}
                    for k, v in proj.items()}
            window_rows = group_caches[0].window.shape[0] + T  # before _keys appends
            pool, idx = self._keys(mine, q[rows].view(B, T, H, D), kv[rows].view(B, T, D),
                                   part, group_caches)  # [B, P, D], [B, T, K]
            pool = self.kv_read(pool, T)
            if active():  # per group: [B, P, D], [B, T, K], its window rows [1] (a schedule's)
                tap(self, "attn.key_pool", pool, idx, torch.full((1,), window_rows))
            local = idx.reshape(B * T, -1)
            offsets = torch.arange(B, device=x.device).repeat_interleave(T)[:, None]
            offsets = offsets * pool.shape[1]  # [B·T, 1]: each sequence's pool in the flat one
            lists.append(KeyList(rows, pool.reshape(-1, D),
                                 torch.where(local >= 0, local + offsets, -1), local,
                                 window_rows))
        o = self.core(q, lists, self.attn_sink, D**-0.5, step)  # [N, H, D]
        tap(self, "attn.sparse_attention", o)  # [N, H, D]
        o = apply_rope(o, cos, sin, inverse=True).reshape(N, a.o_groups, -1)  # [N, G, H·D/G]
        tap(self, "attn.o", o)  # wo_a's input
        o = self.wo_a_input(o)
        wo_a = self.wo_a.value().view(a.o_groups, a.o_lora_rank, -1)  # FP8-valued at deployment
        o = torch.einsum("tgd,grd->tgr", o, wo_a).reshape(N, -1)  # grouped low-rank output
        tap(self, "attn.wo_a", o)  # [N, G·o_lora]
        return self.wo_b(o)

    def _project(
        self, x: torch.Tensor, qr: torch.Tensor, step: Step
    ) -> dict[str, dict[str, torch.Tensor]]:
        """The compressor's and the indexer's token-wise projections over all N rows."""
        out: dict[str, dict[str, torch.Tensor]] = {}
        if self.compressor is not None:
            kv, score = self.compressor.project(x, step.token_positions)
            out["comp"] = {"kv": kv, "score": score}
        if self.indexer is not None:
            out["index"] = self.indexer.project(x, qr, step)
        return out

    def _keys(
        self, proj: dict[str, dict[str, torch.Tensor]], q: torch.Tensor, kv: torch.Tensor,
        step: Step, caches: list[LayerCache],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One group (`step`, B sequences of T tokens): the key pools [B, w + m, D] (window
        rows, then compressed entries) and key lists [B, T, K]; runs the compressors and the
        indexer on the group's projections ([B, T, ...]) and updates the caches."""
        a, D, B = self.a, self.a.head_dim, len(caches)
        window = torch.cat((torch.stack([c.window for c in caches]), kv), 1)  # [B, W, D]
        window_start = int(step.positions[0]) - caches[0].window.shape[0]
        n_comp = torch.zeros_like(step.positions)
        comp_ids, entries = None, window.new_empty(B, 0, D)
        if self.compressor is not None:
            self.compressor.absorb(proj["comp"]["kv"], proj["comp"]["score"], step,
                                   [c.comp for c in caches])
            entries = torch.stack([c.comp.entries.view() for c in caches])  # [B, m, D]
            n_comp = torch.clamp((step.positions + 1) // self.ratio, max=entries.shape[1])
        if self.indexer is not None:
            comp_ids, n_comp = self._select(proj["index"], q, entries, n_comp, step, caches)
        pool = torch.cat((window, entries), 1)
        idx = key_lists(
            step.positions, a.sliding_window, window_start, window.shape[1], n_comp, comp_ids
        )
        if step.trace is not None:
            step.trace[self.layer_id] = (kv, proj)
        keep = min(a.sliding_window - 1, window.shape[1])
        end = int(step.positions[-1]) + 1
        for b, cache in enumerate(caches):
            cache.window = window[b, window.shape[1] - keep :].clone()
            cache.window_start = end - keep
        return pool, idx.expand(B, *idx.shape[-2:])

    def _select(
        self, proj: dict[str, torch.Tensor], q: torch.Tensor, entries: torch.Tensor,
        n_comp: torch.Tensor, step: Step, caches: list[LayerCache],
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """CSA: the indexer's top-k entries (comp_ids [B, T, topk], their count [B, T]); in
        training, every visible entry (dense warm-up) and the indexer's distillation loss."""
        train, states = step.train, [c.index for c in caches]
        if train is None:
            comp_ids = self.indexer(proj, step, states)
            return comp_ids, (comp_ids >= 0).sum(-1)
        scores = self.indexer.group_scores(proj, step, states)
        if train.indexer_losses is not None and scores is not None:
            train.indexer_losses.append(indexer_distillation(q, entries, scores, n_comp))
        if train.dense_csa:
            return None, n_comp
        B, T = q.shape[:2]
        if scores is None:
            ids = torch.full((B, T, self.indexer.topk), -1, dtype=torch.int64, device=q.device)
        else:
            ids = self.indexer.selection(scores, self.indexer.topk, step)
        return ids, (ids >= 0).sum(-1)


# ---- MoE ----------------------------------------------------------------------------------------


class Gate(nn.Module):
    """Router: hash layers select by `tid2eid[token]`, the others by top-k of score + bias."""

    def __init__(self, a: ModelArgs, layer_id: int) -> None:
        super().__init__()
        self.a, self.is_hash = a, a.is_hash_layer(layer_id)
        self.weight = _param(a.n_routed_experts, a.hidden_size)
        if self.is_hash:
            self.register_buffer(
                "tid2eid", torch.empty(a.vocab_size, a.num_experts_per_tok, dtype=torch.int64)
            )
        else:
            self.bias = _param(a.n_routed_experts)  # selection only

    def forward(self, x: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, dim] -> normalised weights [T, k] fp32 (no rsf), expert ids [T, k]."""
        logits = x @ self.weight.T
        func = self.a.scoring_func
        scores = (
            torch.sigmoid(logits)
            if func == "sigmoid"
            else logits.softmax(-1)
            if func == "softmax"
            else F.softplus(logits).sqrt()
        )
        if self.is_hash:
            ids = self.tid2eid[tokens]
        else:
            ids = torch.topk(scores + self.bias, self.a.num_experts_per_tok, dim=-1).indices
        w = scores.gather(1, ids)
        if self.a.norm_topk_prob or func != "softmax":
            w = w / w.sum(-1, keepdim=True)
        return w, ids


class Expert(nn.Module):
    def __init__(self, dim: int, inter: int) -> None:
        super().__init__()
        self.w1, self.w2, self.w3 = _linear(dim, inter), _linear(inter, dim), _linear(dim, inter)


@dataclass(frozen=True)
class QuantExpert:
    """An expert's NVFP4 weights, the global scales of w1 and w3, and the static activation
    global scales of its two GEMMs (the checkpoint's `input_scale` of w1 and of w2; None:
    dynamic per token)."""

    w1: torch.Tensor
    w2: torch.Tensor
    w3: torch.Tensor
    g1: float
    g3: float
    a1: float | None = None
    a2: float | None = None


def swiglu(
    gate: torch.Tensor,
    up: torch.Tensor,
    limit: float | None,
    alpha: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """silu(gate)·up with DeepSeek-V4's clamp (gate <= limit, |up| <= limit). `alpha`
    (per-row [T, 1] for gate and up) scales the limit: the TRT-LLM ignore-alpha fault."""
    if limit is not None and limit > 0 and alpha is None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    elif limit is not None and limit > 0:
        lg, lu = limit * alpha[0], limit * alpha[1]  # [T, 1] each
        gate, up = torch.minimum(gate, lg), torch.maximum(torch.minimum(up, lu), -lu)
    return F.silu(gate) * up


def _row_global_scale(x: torch.Tensor) -> torch.Tensor:
    """Dynamic per-token NVFP4 global scale amax(row) / (6·448): [T, 1]."""
    return x.abs().amax(-1, keepdim=True) / (E2M1_MAX * E4M3_MAX)


def _act_global_scale(x: torch.Tensor, static: float | None) -> torch.Tensor:
    """The NVFP4 activation global scale [T, 1]: the checkpoint's calibrated `input_scale`
    (SGLang's `w13_input_scale` / `w2_input_scale`), or dynamic per token when it has none."""
    if static is None:
        return _row_global_scale(x)
    return torch.full((x.shape[0], 1), static, dtype=x.dtype, device=x.device)


class MoE(nn.Module):
    """Routed experts (weighted, routed_scaling_factor exactly once) + unscaled shared expert."""

    def __init__(
        self, a: ModelArgs, layer_id: int, expert_ids: Sequence[int] | None = None
    ) -> None:
        super().__init__()
        self.a, self.layer_id = a, layer_id
        ids = range(a.n_routed_experts) if expert_ids is None else expert_ids
        self.gate = Gate(a, layer_id)
        self.experts = nn.ModuleDict(
            {str(e): Expert(a.hidden_size, a.moe_intermediate_size) for e in ids}
        )
        self.shared_experts = Expert(a.hidden_size, a.n_shared_experts * a.moe_intermediate_size)
        self._quant: dict[int, QuantExpert] = {}
        self.install(PatchSwaps(Numerics(), a))

    def install(self, swaps: PatchSwaps) -> None:
        """Its swappable places: where routed_scaling_factor is applied (`routed_scaling`), how
        its routed experts compute (`expert_quant`) and clamp (`expert_clamp`)."""
        a, layer = self.a, self.layer_id
        self.routed_scaling = swaps.value(Op.ROUTED_SCALING,
                                          RunnerScales(a.routed_scaling_factor), layer)
        self.expert_quant = swaps.value(Op.EXPERT_QUANT,
                                        stock_expert_quant(a, layer, swaps.numerics), layer)
        self.expert_clamp = swaps.value(Op.EXPERT_CLAMP,
                                        stock_expert_clamp(swaps.numerics.moe_backend), layer)

    def prepare(
        self, numerics: Numerics, nvfp4_stored: Mapping[str, tuple[float, float | None]]
    ) -> None:
        """The routed experts' NVFP4 weights when the layer's experts are NVFP4 (None otherwise).

        At `deployment` a weight the checkpoint stores in NVFP4 (`nvfp4_stored`: its name ->
        its fp32 global scale `weight_scale_2` and its `input_scale`) is used exactly as stored,
        with the stored static activation scales; any other is quantised here (E4M3 scale per
        16, global amax / (6·448); dynamic activation scales). At `exact` the weights are
        fake-quantised as `nvfp4-dispatch` did before precisions existed. Derived from the
        parameters every time, so a second `configure` equals a fresh load."""
        self._quant = {}
        if not (self.expert_quant.nvfp4 and self.layer_id < self.a.num_hidden_layers):
            return
        for key, ex in self.experts.items():
            ws, gs, acts = [], [], []
            for leaf in ("w1", "w2", "w3"):
                w = getattr(ex, leaf).weight
                name = f"layers.{self.layer_id}.ffn.experts.{key}.{leaf}.weight"
                if numerics.deployment and name in nvfp4_stored:
                    ws.append(w)
                    gs.append(nvfp4_stored[name][0])
                    acts.append(nvfp4_stored[name][1])
                else:
                    g = default_global_scale(w)
                    ws.append(nvfp4_fake_quant(w, global_scale=g))
                    gs.append(float(g))
                    acts.append(None)
            self._quant[int(key)] = QuantExpert(ws[0], ws[1], ws[2], gs[0], gs[2], acts[0], acts[1])

    def forward(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        a = self.a
        w, ids = self.gate(x, step.tokens)
        if step.train is not None and step.train.expert_loads is not None:
            step.train.expert_loads[self.layer_id] = torch.bincount(
                ids.flatten(), minlength=a.n_routed_experts)
        w = self.routed_scaling.topk(w)
        if step.train is not None and step.train.dense_experts:
            routed = self._routed_dense(x, w, ids)
        else:
            routed = self._routed(x, w, ids)
        routed = self.routed_scaling.runner(routed)
        tap(self, "moe.combine", routed, inputs=(x, w, ids))  # [N, dim]: Σ w_k·expert_k, ×rsf
        sh = self.shared_experts
        return routed + sh.w2(swiglu(sh.w1(x), sh.w3(x), a.swiglu_limit))

    def _routed_dense(self, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Training: every expert on every token, weighted by the (sparse) routing weights.
        The same sum as `_routed` in a few batched GEMMs instead of a launch-bound loop over
        experts (tiny experts make the extra FLOPs free). x [N, dim] -> [N, dim]."""
        E = self.a.n_routed_experts
        dense_w = x.new_zeros(x.shape[0], E).scatter_add(1, ids, w)  # [N, E]
        w1 = torch.stack([self.experts[str(e)].w1.weight for e in range(E)])  # [E, F, dim]
        w3 = torch.stack([self.experts[str(e)].w3.weight for e in range(E)])
        w2 = torch.stack([self.experts[str(e)].w2.weight for e in range(E)])  # [E, dim, F]
        h = swiglu(torch.einsum("nd,efd->enf", x, w1), torch.einsum("nd,efd->enf", x, w3),
                   self.a.swiglu_limit)
        return torch.einsum("enf,edf,ne->nd", h, w2, dense_w)

    def routed_clamp(self) -> str:
        """How its routed experts clamp SwiGLU: `limit`, `none` or `limit*alpha` (NVFP4
        experts: the `expert_clamp` place; any other: DeepSeek-V4's limit)."""
        return self.expert_clamp if self._quant else "limit"

    def _routed(self, x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Σ_k w_k·expert_{ids_k}(x), one batched pass per expert that has tokens."""
        k = ids.shape[1]
        flat = ids.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.a.n_routed_experts).tolist()
        rows_all, w_all = order // k, w.flatten()[order]
        clamp = self.routed_clamp()
        act_quant = bool(self._quant) and self.expert_quant.act_quant
        out, start = torch.zeros_like(x), 0
        for e, c in enumerate(counts):
            if c == 0:
                continue
            rows, we = rows_all[start : start + c], w_all[start : start + c]
            start += c
            y = self._expert(e, x[rows], clamp, act_quant)
            out.index_add_(0, rows, y * we[:, None])
        return out

    def _expert(self, e: int, xe: torch.Tensor, clamp: str, act_quant: bool) -> torch.Tensor:
        if str(e) not in self.experts:
            raise KeyError(f"layer {self.layer_id}: expert {e} was not built (partial layer)")
        q = self._quant.get(e)
        ex = self.experts[str(e)]
        w1, w2, w3 = (q.w1, q.w2, q.w3) if q else (ex.w1.weight, ex.w2.weight, ex.w3.weight)
        a_scale = torch.ones(xe.shape[0], 1, dtype=xe.dtype, device=xe.device)
        if act_quant:  # W4A4: the GEMM input is NVFP4 too (static or per-token global scale)
            a_scale = _act_global_scale(xe, q.a1)
            xe = nvfp4_fake_quant(xe, global_scale=a_scale)
        gate, up = xe @ w1.T, xe @ w3.T
        limit = None if clamp == "none" else self.a.swiglu_limit
        alpha = (a_scale * q.g1, a_scale * q.g3) if clamp == "limit*alpha" and q else None
        h = swiglu(gate, up, limit, alpha)
        if act_quant:
            h = nvfp4_fake_quant(h, global_scale=_act_global_scale(h, q.a2))
        return h @ w2.T


# ---- decoder block, MTP, model ------------------------------------------------------------------


class Block(nn.Module):
    """One decoder layer: mHC around attention, then mHC around the MoE."""

    def __init__(
        self, a: ModelArgs, layer_id: int, expert_ids: Sequence[int] | None = None
    ) -> None:
        super().__init__()
        self.a, self.layer_id = a, layer_id
        n, mix = a.hc_mult, (2 + a.hc_mult) * a.hc_mult
        self.attn_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.ffn_norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        for site in ("attn", "ffn"):
            setattr(self, f"hc_{site}_fn", _param(mix, n * a.hidden_size))
            setattr(self, f"hc_{site}_base", _param(mix))
            setattr(self, f"hc_{site}_scale", _param(3))
        self.attn = Attention(a, layer_id)
        self.ffn = MoE(a, layer_id, expert_ids)
        self._install_mixes(PatchSwaps(Numerics(), a))  # the attention and MoE have theirs

    def install(self, swaps: PatchSwaps) -> None:
        """The layer's swappable places (its two mHC mixing GEMMs, its attention's, its MoE's)
        as the patch set `swaps` puts them in."""
        self._install_mixes(swaps)
        self.attn.install(swaps)
        self.ffn.install(swaps)

    def _install_mixes(self, swaps: PatchSwaps) -> None:
        a, layer, deploy = self.a, self.layer_id, swaps.numerics.deployment
        # At deployment SGLang's token-count dispatch: the model's (or MTP's) first hc_pre is
        # `mhc_pre`, every later one a fused post+pre boundary (reference/dispatch.py).
        first = layer == 0 or layer >= a.num_hidden_layers
        self.hc_attn_mixes = swaps.module(Op.MHC_MIXES, stock_mixes(a, deploy, first), layer)
        self.hc_ffn_mixes = swaps.module(Op.MHC_MIXES, stock_mixes(a, deploy, False), layer)

    def forward(
        self, h: torch.Tensor, step: Step, cache: LayerCache | list[LayerCache]
    ) -> torch.Tensor:
        """h [T, n, dim] -> [T, n, dim] (T: every token of the step, batch flattened)."""
        sk = step.ops.sinkhorn
        x, post, comb = hc_pre(
            h, self.hc_attn_fn, self.hc_attn_scale, self.hc_attn_base, self.a,
            self.hc_attn_mixes, sk,
        )
        tap(self, "mhc.pre_attn", x, post, comb, inputs=(h,))
        h = hc_post(self.attn(self.attn_norm(x), step, cache), h, post, comb)
        tap(self, "mhc.post_attn", h)
        x, post, comb = hc_pre(
            h, self.hc_ffn_fn, self.hc_ffn_scale, self.hc_ffn_base, self.a,
            self.hc_ffn_mixes, sk,
        )
        tap(self, "mhc.pre_ffn", x, post, comb, inputs=(h,))
        return hc_post(self.ffn(self.ffn_norm(x), step), h, post, comb)


class MTPBlock(Block):
    """Multi-token prediction: a SWA decoder layer on the main model's final streams mixed with
    the next token's embedding, with its own hc_head and norm and the shared head."""

    def __init__(self, a: ModelArgs, layer_id: int) -> None:
        super().__init__(a, layer_id)
        self.e_proj = _linear(a.hidden_size, a.hidden_size)
        self.h_proj = _linear(a.hidden_size, a.hidden_size)
        self.enorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.hnorm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.hc_head_fn = _param(a.hc_mult, a.hc_mult * a.hidden_size)
        self.hc_head_base = _param(a.hc_mult)
        self.hc_head_scale = _param(1)


class Transformer(nn.Module):
    """DeepSeek-V4 causal LM. Build with `build_model`; set the patch set with `configure`."""

    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.a = a
        self.embed = Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList(Block(a, i) for i in range(a.num_hidden_layers))
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.head = _linear(a.hidden_size, a.vocab_size)
        self.hc_head_fn = _param(a.hc_mult, a.hc_mult * a.hidden_size)
        self.hc_head_base = _param(a.hc_mult)
        self.hc_head_scale = _param(1)
        L = a.num_hidden_layers
        self.mtp = nn.ModuleList(MTPBlock(a, L + i) for i in range(a.num_nextn_predict_layers))
        self.rope_main = Rope(a.qk_rope_head_dim, a.rope_theta, None)
        self.rope_compress = Rope(a.qk_rope_head_dim, a.compress_rope_theta, a.rope_scaling)
        self.numerics, self.ops = Numerics(), Ops.for_device(torch.device("cpu"))
        # How the checkpoint stored each weight (`load_model` fills them; empty: fp32 values):
        # weight name -> format (`quant_formats.classify`); NVFP4 ones -> (global, input) scales.
        self.stored_formats: dict[str, str] = {}
        self.nvfp4_scales: dict[str, tuple[float, float | None]] = {}
        self._install(PatchSwaps(self.numerics, a))

    def configure(self, numerics: Numerics) -> None:
        """Install a patch set and precision (after the weights are loaded): every swappable
        place gets what the set's swaps build there (`reference/swappable.py`), and everything
        the numerics derive from the weights (FP8 and NVFP4 values) is rebuilt from the
        parameters, so calling it again on a loaded model equals a fresh load with
        `numerics`."""
        self.numerics = numerics
        self.ops = Ops.for_device(self.embed.weight.device)
        for name, module in self.named_modules():
            if isinstance(module, Linear):
                fp8 = numerics.deployment and is_fp8_module(name)
                module.fp8_weight = self._fp8_weight(name, module) if fp8 else None
        swaps = PatchSwaps(numerics, self.a)
        for block in [*self.layers, *self.mtp]:
            block.install(swaps)
            block.ffn.prepare(numerics, self.nvfp4_scales)
        self._install(swaps)

    def _install(self, swaps: PatchSwaps) -> None:
        """The model-wide places: the final state before the head (`head_input`), and those
        the scheduler reads: speculative verification and the sliding window's store."""
        self.head_input = swaps.module(Op.HEAD_INPUT, keep_head_input)
        self.spec_verify = swaps.value(Op.SPEC_VERIFY, Verification())
        self.window_store = swaps.value(Op.WINDOW_STORE, NoWindowStore)

    def _fp8_weight(self, name: str, module: Linear) -> torch.Tensor:
        """The block-FP8 value of a dense weight: as stored, or quantised now."""
        if self.stored_formats.get(name + ".weight") == "fp8-block":
            return module.weight
        return fp8_block_weight(module.weight)

    def new_cache(self, mtp: bool = False) -> ModelCache:
        """An empty cache; `mtp`: with the MTP layer's state (speculative decoding)."""
        device = self.embed.weight.device
        state = MTPState(self.mtp[0].attn.new_cache(device)) if mtp else None
        return ModelCache([blk.attn.new_cache(device) for blk in self.layers], 0, state)

    def _step(
        self, tokens: torch.Tensor, start: int, batch: int = 1, train: TrainHooks | None = None
    ) -> Step:
        """tokens [batch·T] (sequences flattened), all at positions start..start+T."""
        T = tokens.shape[0] // batch
        positions = torch.arange(start, start + T, device=tokens.device)
        flat = positions.repeat(batch)
        return Step(
            tokens,
            positions,
            self.rope_main.cos_sin(flat),
            self.rope_compress.cos_sin(flat),
            flat,
            self.numerics,
            self.ops,
            batch,
            train,
        )

    def _ragged_step(self, parts: list[Step]) -> Step:
        """One step over several groups' rows, concatenated in order (see `Step`)."""
        if len(parts) == 1:
            return parts[0]
        rows, at = [], 0
        for part in parts:
            rows.append((at, part))
            at += part.tokens.shape[0]

        def cat(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
            return tuple(torch.cat(side) for side in zip(*pairs, strict=True))

        return Step(
            torch.cat([p.tokens for p in parts]),
            parts[0].positions,  # unused in a ragged step
            cat([p.main_rope for p in parts]),
            cat([p.compress_rope for p in parts]),
            torch.cat([p.token_positions for p in parts]),
            self.numerics,
            self.ops,
            sum(p.batch for p in parts),
            None,
            tuple(rows),
        )

    def forward_hidden(self, tokens: torch.Tensor, cache: ModelCache) -> torch.Tensor:
        """tokens [T] (the next T of the sequence) -> final streams [T, n, dim]; updates cache."""
        return self.forward_ragged([(tokens, cache)])

    def forward_ragged(self, chunks: Sequence[tuple[torch.Tensor, ModelCache]],
                       traces: Sequence[dict[int, Any]] | None = None) -> torch.Tensor:
        """One forward over several sequences' next tokens, each with its own cache: chunks of
        (tokens [T_i], cache) -> final streams [ΣT_i, n, dim] in the same order; updates the
        caches. Token-wise ops see the concatenated rows once (so a kernel that picks its tiling
        from the row count sees the whole batch, as on the deployment); attention, compressors
        and indexer run per sequence against its cache. `traces` (one dict per chunk): see
        `Step.trace`."""
        if not chunks:
            raise ValueError("forward_ragged needs at least one chunk")
        parts = [self._step(t, c.n_tokens) for t, c in chunks]
        if traces is not None:
            parts = [replace(p, trace=tr) for p, tr in zip(parts, traces, strict=True)]
        step = self._ragged_step(parts)
        h = self.embed(step.tokens)[:, None, :].expand(-1, self.a.hc_mult, -1)  # n streams
        for i, block in enumerate(self.layers):
            h = block(h, step, [c.layers[i] for _, c in chunks])
        for tokens, cache in chunks:
            cache.n_tokens += tokens.shape[0]
        return h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final streams [T, n, dim] -> logits [T, vocab] fp32."""
        x = hc_head(h, self.hc_head_fn, self.hc_head_scale, self.hc_head_base, self.a)
        x = self.head_input(x)
        tap(self, "mhc.head", x)  # [T, dim]
        return self.head(self.norm(x))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Full recompute: tokens [T] -> logits [T, vocab]."""
        return self.logits(self.forward_hidden(tokens, self.new_cache()))

    def forward_batch(self, tokens: torch.Tensor, train: TrainHooks | None = None) -> torch.Tensor:
        """Full recompute of B sequences of equal length: tokens [B, T] -> logits [B, T, vocab]
        (for training; each sequence gets its own cache, token-wise ops run batched)."""
        B, T = tokens.shape
        return self.logits(self.hidden_batch(tokens, train)).view(B, T, -1)

    def hidden_batch(self, tokens: torch.Tensor, train: TrainHooks | None = None) -> torch.Tensor:
        """The final streams of B equal-length sequences: tokens [B, T] -> [B·T, n, dim]
        (before hc_head; `forward_batch`'s body, also the MTP layer's input)."""
        B, _ = tokens.shape
        caches = [self.new_cache() for _ in range(B)]
        flat = tokens.reshape(-1)
        step = self._step(flat, 0, B, train)
        h = self.embed(flat)[:, None, :].expand(-1, self.a.hc_mult, -1)
        for i, block in enumerate(self.layers):
            h = block(h, step, [c.layers[i] for c in caches])
        return h

    def mtp_logits(
        self, h: torch.Tensor, next_tokens: torch.Tensor, depth: int = 0
    ) -> torch.Tensor:
        """MTP module `depth` over a whole sequence (full recompute, not used for serving).
        h: main final streams [T, n, dim] for tokens 0..T-1; next_tokens [T] = tokens 1..T.
        Returns logits [T, vocab] predicting tokens 2..T+1."""
        blk = self.mtp[depth]
        step = self._step(next_tokens, 0)
        e = blk.e_proj(blk.enorm(self.embed(next_tokens)))  # [T, dim]
        x = blk.h_proj(blk.hnorm(h)) + e[:, None, :]  # [T, n, dim]
        x = Block.forward(blk, x, step, blk.attn.new_cache(h.device))
        y = hc_head(x, blk.hc_head_fn, blk.hc_head_scale, blk.hc_head_base, self.a)
        return self.head(blk.norm(y))


def is_fp8_module(name: str) -> bool:
    """The modules the NVFP4 checkpoint keeps in block FP8 (DeepSeek names): the attention's
    projections (not its compressor or indexer, which are bf16), the shared experts, MTP's
    e_proj / h_proj."""
    leaf = name.rsplit(".", 1)[-1]
    attn = ".attn." in name and ".compressor." not in name and ".indexer." not in name
    return (attn and leaf in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b")) or (
        ".shared_experts." in name or leaf in ("e_proj", "h_proj"))


def build_model(a: ModelArgs, device: torch.device | str = "cpu") -> Transformer:
    """An uninitialised model (fill it with `checkpoint.init_model` or `checkpoint.load_into`)."""
    with torch.device(device):
        model = Transformer(a)
    model.ops = Ops.for_device(torch.device(device))
    return model.eval()


def build_block(
    a: ModelArgs,
    layer_id: int,
    *,
    expert_ids: Sequence[int] | None = None,
    device: torch.device | str = "cpu",
) -> Block:
    """One uninitialised decoder layer (e.g. a real `flash` layer with a subset of experts)."""
    with torch.device(device):
        block = Block(a, layer_id, expert_ids)
    return block.eval()
