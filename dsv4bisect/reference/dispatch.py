"""SGLang's token-count kernel dispatch for DeepSeek-V4, as rules the embedded engine follows.

SGLang's DeepSeek-V4 kernels choose a split-K count or a kernel variant from the number of
tokens in the forward batch (sglang PR #37292, "Support deterministic inference for
DeepSeek-V4", lists such sites; the first is the mHC pre-norm split-K, which moves every
token's logprob by ~1e-2 with its batch mates). At `precision: deployment` the embedded engine
takes the decision DeepSeek-V4-Flash's deployment takes for the same batch: the rule is
evaluated at Flash's shapes (`FLASH`) with the leading dimension M of the tensor an op is given
(every token of the step, the batch flattened) and the rows' real positions, and the decision is
applied to the tiny tensors (`fit_mhc_plan`, `fit_cut`), so a request's numerics depend on its
chunk and its batch mates as on the deployment. Mirrored: the mHC pre-norm GEMM's split-K count and kernel
(`mhc_pre_plan`) and FlashMLA's split-KV schedule of the sparse attention
(`flashmla_segments`). Per site, what SGLang does, what is mirrored and what is not, and why:
docs/reference-engine.md, "Batch-dependent kernel dispatch".

Sources (wheel paths; line numbers of the PyPI wheels):
- `_compute_num_split_for_mhc_pre`: 0.5.13 `srt/layers/mhc.py:445-450`, 0.5.23
  `kernels/ops/layernorm/mhc.py:816-823`; used by `mhc_pre` when DeepGEMM's TF32 pre-norm GEMM
  is on (0.5.13 `:674-690`, 0.5.23 `:1118-1135`) and by `mhc_fused_post_pre` above
  `fma_token_threshold = 32` (0.5.13 `:1233-1238`, 0.5.23 `:1693-1698`).
- `mhc_fused_post_pre` replaces every sublayer boundary (post of one sublayer + pre of the
  next) when `SGLANG_OPT_FUSE_MHC_POST_PRE` is on: default False in 0.5.13
  (`srt/environ.py:759`), True in 0.5.23 (`srt/environ.py:1823`; gate
  `srt/models/deepseek_common/amd/deepseek_v4_fused_mhc.py:70-101`, used at
  `srt/models/deepseek_v4.py:3191-3197`). The model's first hc_pre has no post before it and
  stays `mhc_pre`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4bisect.reference.config import CSA_RATIO, PRESETS, ModelArgs

# The GPU the rules are evaluated for: `torch.cuda.get_device_properties(0).multi_processor_count`
# of an H200 (SM90, where DeepGEMM's TF32 pre-norm GEMM runs). An RTX PRO 6000 (SM120) has 188.
H200_SMS = 132
# The release whose dispatch the engine follows (0.5.13 is described beside it for comparison).
RELEASE = "0.5.23"
RELEASES = ("0.5.13", "0.5.23")
FUSED_POST_PRE_DEFAULT = {"0.5.13": False, "0.5.23": True}  # SGLANG_OPT_FUSE_MHC_POST_PRE

MHC_BLOCK_M = 64  # the DeepGEMM kernel's token tile in `_compute_num_split_for_mhc_pre`
MHC_BLOCK_K = 64
FMA_TOKEN_THRESHOLD = 32  # mhc_fused_post_pre: scalar-FMA TileLang kernel at or below this


@dataclass(frozen=True)
class DispatchShapes:
    """The model shapes SGLang's dispatch rules read, as one GPU of the deployment sees them.

    The embedded engine stands in for DeepSeek-V4-Flash on its deployment, so its kernel
    decisions are the ones the deployment takes for the same batch: the rules are evaluated at
    Flash's shapes (`FLASH`) with the batch's real token counts and positions, and the decision
    (a split count, a row's cut points) is then applied to the tiny tensors (`fit_mhc_plan`,
    `flashmla_segments`). What one GPU of TP8 sees, per rule (from the source):
    - mHC pre-norm: `hc_fn` is a plain replicated parameter [(2+n)·n, n·D] (0.5.23
      `srt/models/deepseek_v4.py:642-645`), the residual streams are full on every rank and
      without DP attention every rank runs every token of the batch: full n·D, full T.
    - FlashMLA: one KV head (MLA), the key lists are not sharded; the query heads (64 / TP)
      are padded back to 64 (`q8kv8_padded_num_heads`, `deepseek_v4_backend.py:4515-4555`),
      and the schedule reads only the key counts and the SM count: full key lists."""

    hidden_size: int
    hc_mult: int
    sliding_window: int
    index_topk: int  # the CSA (ratio 4) layers' extra list is capped here
    hca_ratio: int  # every other compressed layer lists all its entries: (p + 1) // ratio

    @classmethod
    def of(cls, a: ModelArgs) -> DispatchShapes:
        hca = [r for r in a.compress_ratios if r and r != CSA_RATIO]
        return cls(a.hidden_size, a.hc_mult, a.sliding_window, a.index_topk,
                   hca[0] if hca else 0)


FLASH = DispatchShapes.of(PRESETS["flash"])  # 4096 · 4 streams, window 128, top-512, c128


def mhc_pre_num_splits(num_tokens: int, hc_hidden_size: int, n_sms: int = H200_SMS) -> int:
    """SGLang's `_compute_num_split_for_mhc_pre`: how many K-partials DeepGEMM's TF32 pre-norm
    GEMM folds the n·D reduction into: one wave of `n_sms` CTAs over ceil(T / 64) token tiles,
    at most a quarter of the 64-wide K blocks, at least 1."""
    grid = (num_tokens + MHC_BLOCK_M - 1) // MHC_BLOCK_M
    num_block_k = (hc_hidden_size + MHC_BLOCK_K - 1) // MHC_BLOCK_K
    return max(1, min(n_sms // max(grid, 1), num_block_k // 4))


@dataclass(frozen=True)
class MhcPrePlan:
    """What SGLang runs for one hc_pre of T tokens.

    kernel: `tf32` - DeepGEMM `tf32_hc_prenorm_gemm` (TF32 tensor-core MMA, fp32 partials per
    K split, added in split order by the big-fuse kernel); `fma` - the TileLang scalar-FMA kernel
    of `mhc_fused_post_pre` (fp32 products and partials)."""

    kernel: str
    n_splits: int


def mhc_pre_plan(
    num_tokens: int,
    hc_mult: int,
    hidden_size: int,
    *,
    first: bool,
    release: str = RELEASE,
    n_sms: int = H200_SMS,
) -> MhcPrePlan:
    """The pre-norm GEMM SGLang runs for an hc_pre over `num_tokens` tokens. `first`: the
    model's first hc_pre (layer 0's attention), which no fused post precedes."""
    if release not in RELEASES:
        raise ValueError(f"no dispatch rules for sglang {release}; known: {', '.join(RELEASES)}")
    hc_hidden = hc_mult * hidden_size
    fused = FUSED_POST_PRE_DEFAULT[release] and not first
    if fused and num_tokens <= FMA_TOKEN_THRESHOLD:
        return MhcPrePlan("fma", 8 if (num_tokens < 8 and hidden_size <= 4096) else 4)
    return MhcPrePlan("tf32", mhc_pre_num_splits(num_tokens, hc_hidden, n_sms))


def fit_mhc_plan(plan: MhcPrePlan, hc_mult: int, hidden_size: int) -> MhcPrePlan:
    """A plan decided at Flash's shapes applied to a smaller reduction: the split count stays,
    capped where a split would fall below the kernel's unit of work - one 64-wide K block of
    n·D for the TF32 GEMM (DeepGEMM's splits are whole K blocks), one element of each
    stream's D for the FMA kernel. The rule's own floor of 4 blocks per split is a property of
    Flash's 256 K blocks, which the decision has already gone through; keeping it at the tiny
    n·D = 1024 (16 blocks) would pin the count at 4 and erase the decision."""
    if plan.kernel == "tf32":
        cap = max(1, -(-hc_mult * hidden_size // MHC_BLOCK_K))
    else:
        cap = hidden_size
    return MhcPrePlan(plan.kernel, min(plan.n_splits, cap))


# ---- FlashMLA's split-KV schedule (sparse decode kernel) ----------------------------------------
# Off SM120, SGLang runs DeepSeek-V4's attention for extend batches of up to 11673 query tokens
# (and every decode batch) through FlashMLA's sparse *decode* kernel, one query row per token
# (0.5.13 `srt/layers/attention/deepseek_v4_backend.py:1258-1310`, 0.5.23 `:2917-2932` and
# `:4384-4399`; `_LARGE_INDEXER_QUERY_THRESHOLD = 11673`, 0.5.13 `dsv4/metadata.py:51`, 0.5.23
# `:66`). FlashMLA spreads the batch's key blocks over the GPU's SMs: a row whose blocks straddle
# two SM parts is computed as two partial softmaxes (fp32 accumulators) merged by their LSE in
# the combine kernel, so where a row is cut depends on every other row of the batch. The rule
# (FlashMLA's `get_mla_metadata`, re-implemented by SGLang 0.5.23 in `kernels/jit/csrc/
# deepseek_v4/flashmla_sched_meta.cuh`, constants `deepseek_v4_backend.py:219-220`,
# `num_sm_parts` `:257`) is `flashmla_split_points`.

FLASHMLA_BLOCK_N = 64  # keys per KV block
FLASHMLA_FIXED_OVERHEAD = 5  # blocks of work charged per (row, part)
SPARSE_PREFILL_THRESHOLD = 11673  # more query tokens: `flash_mla_sparse_fwd`, no split-KV


def flashmla_keys(n_window: int, n_compressed: int, compressed_layer: bool) -> int:
    """A row's key count as the scheduler sees it: the window list (at least 1), then on
    compressed layers the extra (c4 / c128) list, starting at the next 64-key block."""
    main = max(n_window, 1)
    if not compressed_layer:
        return main
    return -(-main // FLASHMLA_BLOCK_N) * FLASHMLA_BLOCK_N + n_compressed


def flashmla_split_points(
    keys: list[int], n_sms: int = H200_SMS, s_q: int = 1
) -> list[list[int]]:
    """Per row, the KV block indices at which FlashMLA cuts it into partials ([] = one piece).

    keys: each row's key count (`flashmla_keys`). Every row costs its blocks plus a fixed
    overhead; the batch's total is dealt out to max(n_sms // s_q, 1) SM parts in row order,
    `payload` = ceil(total / parts) + overhead per part; a part that cannot take a whole row
    takes `remaining payload - overhead` of its blocks (if that is positive) and the row goes on
    in the next part."""
    parts = max(n_sms // s_q, 1)
    blocks = [max(k - 1, 0) // FLASHMLA_BLOCK_N + 1 for k in keys]
    total = sum(n + FLASHMLA_FIXED_OVERHEAD for n in blocks)
    payload = -(-total // parts) + FLASHMLA_FIXED_OVERHEAD
    cuts: list[list[int]] = [[] for _ in keys]
    row, block = 0, 0
    for _ in range(parts):
        remain = payload
        while row < len(keys):
            left = blocks[row] - block
            if remain >= left + FLASHMLA_FIXED_OVERHEAD:
                remain -= left + FLASHMLA_FIXED_OVERHEAD
                row, block = row + 1, 0
                continue
            if remain - FLASHMLA_FIXED_OVERHEAD > 0:
                block += remain - FLASHMLA_FIXED_OVERHEAD
                cuts[row].append(block)
            break
        if row == len(keys):
            break
    return cuts


def flash_lists(positions: torch.Tensor, ratio: int, shapes: DispatchShapes = FLASH
                ) -> tuple[list[int], list[int]]:
    """Per query row, the window and compressed list lengths Flash's layer of the same kind has
    for a token at that position: the last `sliding_window` tokens, then on a CSA layer
    (ratio 4) up to `index_topk` indexer-chosen entries, on any other compressed layer (the
    tiny checkpoint's 16 stands for Flash's 128) every entry of `hca_ratio` tokens."""
    p1 = positions.to(torch.int64) + 1
    n_win = torch.clamp(p1, max=shapes.sliding_window)
    if ratio == 0:
        n_comp = torch.zeros_like(p1)
    elif ratio == CSA_RATIO:
        n_comp = torch.clamp(p1 // CSA_RATIO, max=shapes.index_topk)
    else:
        n_comp = p1 // shapes.hca_ratio
    return n_win.tolist(), n_comp.tolist()


def fit_cut(block: int, flash_win: int, flash_comp: int, n_win: int, n_comp: int) -> int:
    """A cut Flash's schedule puts before KV block `block` of a row, moved to the same relative
    place in the tiny row's list (window rank 0..n_win-1, then its compressed entries): in the
    window part at the same fraction of the window, in the compressed part at the same fraction
    of the compressed list (Flash's compressed list starts at the next 64-key block)."""
    key = block * FLASHMLA_BLOCK_N
    main = -(-max(flash_win, 1) // FLASHMLA_BLOCK_N) * FLASHMLA_BLOCK_N
    if key < main or flash_comp == 0:
        return round(min(key, flash_win) / max(flash_win, 1) * n_win)
    return n_win + round((key - main) / flash_comp * n_comp)


def flashmla_segments(
    idx: torch.Tensor, window_rows: int | torch.Tensor, positions: torch.Tensor, ratio: int,
    shapes: DispatchShapes = FLASH, n_sms: int = H200_SMS,
) -> torch.Tensor | None:
    """The piece of every list position of a batch's key lists, as FlashMLA would cut them on
    the deployment.

    idx: [N, K] one list per query row (its sequence's pool rows: < window_rows are window
    tokens, the rest compressed entries; -1 = none); window_rows: one int for every row, or [N]
    (ragged batches: each row's own sequence); positions: [N] each row's position in its
    sequence; ratio: the layer's compress ratio. The schedule is dealt over Flash's key counts
    for these positions (`flash_keys`), every row of the batch together; each cut is moved into
    the tiny row (`fit_cut`), where a position's place is its rank in its own list (window
    first, then compressed entries, as the scheduler sees them). Returns [N, K] int64, or None
    when no row is cut (or the batch takes the sparse prefill kernel)."""
    N = idx.shape[0]
    if N == 0 or N > SPARSE_PREFILL_THRESHOLD:
        return None
    f_win, f_comp = flash_lists(positions, ratio, shapes)
    cuts = flashmla_split_points(
        [flashmla_keys(w, c, ratio > 0) for w, c in zip(f_win, f_comp, strict=True)], n_sms)
    cut_rows = [r for r, c in enumerate(cuts) if c]
    if not cut_rows:
        return None
    valid = idx >= 0
    w = torch.as_tensor(window_rows, device=idx.device)
    comp = valid & (idx >= (w[:, None] if w.dim() == 1 else w))
    win = valid & ~comp
    n_win, n_comp = win.sum(1), comp.sum(1)
    rank = torch.where(comp, n_win[:, None] + torch.cumsum(comp, 1) - 1, torch.cumsum(win, 1) - 1)
    seg = torch.zeros_like(rank)
    for r in cut_rows:
        nw, nc = int(n_win[r]), int(n_comp[r])
        tiny = sorted({t for c in cuts[r]
                       if 0 < (t := fit_cut(c, f_win[r], f_comp[r], nw, nc)) < nw + nc})
        for t in tiny:
            seg[r] += (rank[r] >= t).long()
    return seg
