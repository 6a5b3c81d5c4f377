"""Field fault variants of the embedded engine: DeepSeek-V4 bugs seen in the field, each modelled
at the place where its patch's code acts and at the size it had (docs/reference-engine.md,
"Field faults"; the citations are in the patch modules' variants).

- `triton-indexer:residue` (vllm#55927, mlx-lm PR #1189): on a CSA (ratio 4) layer, a query
  whose sequence length (position + 1) is 3 (mod 4) gets the top-k entry ids shifted by one
  compressed entry: it attends to the block after each selected one. Exact at every other
  residue, so a prompt of length 3 (mod 4) answers from the neighbours of what the indexer
  found (a wrong digit, not garbage).
- `mma-decode:batch-kv-slot` (sglang#33397): in a forward that holds several requests, the FP8 KV
  write puts the previous request's first new row into each later request's first new slot (a
  page-slot offset that is off by one request). A lone request is exact; under concurrency every
  decode step of a batched request writes a foreign key, so the corruption grows with the
  output's length and with the number of requests batched, as the field saw it.
- `mma-decode:decode-rope-fp8` (sglang#25790): the decode kernel reads the MODEL1 page's bf16
  rope dims as FP8-E4M3 (the nope dims' format); prefill reads them right, so prefill and
  decode logprobs of the same tokens diverge, and only with an FP8 KV cache (`deployment`).
- `mma-decode:compress-rope-base` (mlx-lm PR #1189): the compressed KV entries written to the
  pages of a compressed layer are rotated with the main layers' RoPE base (`rope_theta` with
  YaRN) instead of the compressed layers' own (`compress_rope_theta` with YaRN), while the
  queries and the sliding window keep the right one. An entry at position 0 is exact (no
  rotation); every later entry's rope dims sit off by (its position) x (the difference of the
  two tables' frequencies), so what only compressed entries hold (everything past the sliding
  window) is read wrongly, and what the window's own keys hold is not.
- `mma-decode:swa-ring-stale` (sglang PR #30339; ROCm/ATOM#1417): the attention backend keeps
  the sliding-window KV in a ring per request slot (position mod window), which is not part of
  the prefix cache; on a prefix-cache hit the window rows of the reused prefix are read from the
  slot's ring, which holds what the slot's previous occupant wrote there (zeros in a slot never
  used). A request without a hit is exact.
- `fp8-wo-a-gemm:scale-layout` (sglang#29038, fix PR #29036): the FP8 `wo_a` path quantises the
  attention output o [T, G, C] as T·G flat rows (row t·G + g), and DeepGEMM's SM100
  `fp8_einsum` reads the activation scales with group-major [G, T] semantics: (token t, group g)
  is dequantised with the scale of flat row g·T + t. Its FP8 codes are right, its scale is
  another (token, group)'s, a power-of-two factor off (UE8M0 scales). T is every row of the
  forward (all requests of a batch); T = 1 (one request decoding alone) is exact.
- `fp8-wo-a-gemm:scale-truncate` (sglang#39193, fix PR #39289): with `DEEPGEMM_SCALE_UE8M0`
  false the codes are quantised with fp32 scales amax / 448 and the kernel reads each scale with
  its mantissa dropped (the power of two at or below it), so every 128-channel block of every
  (token, group) reads between half and all of its value, at any T.
"""

from __future__ import annotations

from collections import deque
from itertools import pairwise

import torch
import torch.nn.functional as F

from dsv4bisect.reference import precision as prec
from dsv4bisect.reference.cache import ModelCache

CSA_RATIO = 4
RESIDUE = 3  # vllm#55927: wrong iff prompt length = 3 (mod 4)


def residue_shift(ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """ids [B, T, K] (valid first, -1 = none) of queries at `positions` [T]: where the query's
    length is RESIDUE (mod 4), every valid id moves to the next entry that query can see (the
    newest stays: there is no next one)."""
    hit = ((positions + 1) % CSA_RATIO == RESIDUE)[None, :, None]  # [1, T, 1]
    n_visible = ((positions + 1) // CSA_RATIO)[None, :, None]
    shifted = torch.where((ids >= 0) & (ids + 1 < n_visible), ids + 1, ids)
    return torch.where(hit, shifted, ids)


def slot_rows(groups: list[tuple[int, int, int]], n_rows: int) -> torch.Tensor:
    """Per row of a step, the row whose KV the `batch-kv-slot` fault writes there: groups are
    (first row, sequences B, tokens T) in row order; the first new row of every request but the
    step's first holds the previous request's first new row (each other row holds its own)."""
    src = torch.arange(n_rows)
    starts = [row + b * T for row, B, T in groups for b in range(B)]
    for prev, start in pairwise(starts):
        src[start] = prev
    return src


def rope_read_as_fp8(pool: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """Key rows [..., D] as a kernel that decodes the rope dims with the nope dims' FP8 format
    reads them: the rope dims through FP8-E4M3 with a UE8M0 scale per row."""
    nope, rope = pool[..., :-rope_dim], pool[..., -rope_dim:]
    return torch.cat((nope, prec._fp8_groups(rope, rope_dim)), -1)


class SwaRings:
    """The sliding-window rings of an attention backend that keeps the window KV per request
    slot (`req_pool_idx * window + position % window`, SGLang's unified_kv layout) instead of in
    the prefix-cached pages: per slot and layer, `window` rows addressed by position mod window.

    Slots are handed out as SGLang's `ReqToTokenPool` does: the first free slot, a freed one
    going to the end of the free list. A request's window rows are in its slot's ring when it
    leaves (`release`); a request that resumes from a prefix-cache snapshot reads the window
    rows of the reused prefix from its own slot's ring (`restore`), not from the snapshot."""

    def __init__(self, n_slots: int, window: int) -> None:
        self.window = window
        self.free: deque[int] = deque(range(n_slots))
        self.rings: dict[int, list[torch.Tensor]] = {}  # slot -> per layer [window, D]

    def alloc(self) -> int:
        if not self.free:
            raise RuntimeError("no free request slot")
        return self.free.popleft()

    def release(self, slot: int, cache: ModelCache | None) -> None:
        """The slot's occupant leaves with `cache`: its window rows stay in the slot's ring."""
        if cache is not None:
            rings = self._rings(slot, cache)
            for ring, layer in zip(rings, cache.layers, strict=True):
                ring[self._ring_index(layer.window_start, layer.window.shape[0])] = layer.window
        self.free.append(slot)

    def restore(self, slot: int, cache: ModelCache) -> None:
        """A prefix-cache hit resumed into `slot`: every layer's window rows (positions
        window_start..n-1) become what the slot's ring holds at their ring index."""
        rings = self._rings(slot, cache)
        for ring, layer in zip(rings, cache.layers, strict=True):
            at = self._ring_index(layer.window_start, layer.window.shape[0])
            layer.window = ring[at].clone()  # a new tensor: the snapshot shares the old one

    def _ring_index(self, start: int, n: int) -> torch.Tensor:
        return torch.arange(start, start + n) % self.window

    def _rings(self, slot: int, cache: ModelCache) -> list[torch.Tensor]:
        if slot not in self.rings:  # a slot never used: its ring memory is zeros
            self.rings[slot] = [layer.window.new_zeros(self.window, layer.window.shape[1])
                                for layer in cache.layers]
        return self.rings[slot]


def _fp8_blocks(o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """o [T, G, C] -> its 128-channel blocks [T, G, ceil(C/128), 128] (zero-padded) and
    their amax [T, G, ceil(C/128), 1]."""
    blocks = F.pad(o, (0, -o.shape[-1] % prec.ACT_GROUP)).unflatten(-1, (-1, prec.ACT_GROUP))
    return blocks, blocks.abs().amax(-1, keepdim=True)


def _codes(blocks: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (blocks / scale).to(torch.float8_e4m3fn).float()


def wo_a_scale_layout(o: torch.Tensor) -> torch.Tensor:
    """o [T, G, C] as the `scale-layout` fault's wo_a GEMM reads it: the codes of (t, g) with
    UE8M0 scales, each dequantised with the scale of flat row g·T + t of the [T·G] rows."""
    T, G, C = o.shape
    blocks, amax = _fp8_blocks(o)
    scale = prec._ue8m0_scale(amax)  # [T, G, K, 1], flat row t·G + g
    t = torch.arange(T, device=o.device)[:, None]
    g = torch.arange(G, device=o.device)[None, :]
    flat = (g * T + t).reshape(-1)  # [T·G]: the row the kernel reads for (t, g)
    read = scale.reshape(T * G, *scale.shape[2:])[flat].view_as(scale)
    return (_codes(blocks, scale) * read).flatten(-2)[..., :C]


def wo_a_scale_truncate(o: torch.Tensor) -> torch.Tensor:
    """o [T, G, C] as the `scale-truncate` fault's wo_a GEMM reads it: codes quantised with
    fp32 scales amax / 448, dequantised with each scale's mantissa dropped."""
    C = o.shape[-1]
    blocks, amax = _fp8_blocks(o)
    scale = torch.where(amax > 0, amax / prec.E4M3_MAX, 1.0)
    read = torch.exp2(torch.floor(torch.log2(scale)))  # the kernel's UE8M0 of an fp32 scale
    return (_codes(blocks, scale) * read).flatten(-2)[..., :C]
