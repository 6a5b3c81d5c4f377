"""Decoding state of the embedded model: sliding-window KV rows and compressor state per layer.

A prompt is processed in chunks and then one token per decode step; everything a later chunk
needs from earlier tokens lives here:
- the last `sliding_window - 1` tokens' K=V rows (a query's window includes itself),
- per compressor (the attention's, and for CSA layers the indexer's): the projections of the
  tokens of the current partial window (`pending_*`), for the overlapping CSA scheme the first
  half (Ca) of the previous complete window (`prev_*`), and every compressed entry emitted so far.
A fresh cache fed the whole prompt in one chunk is the full recompute.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class Rows:
    """Rows appended to a preallocated [capacity, width] buffer that doubles when full."""

    def __init__(self, width: int, device: torch.device, capacity: int = 64) -> None:
        self._buf = torch.empty(capacity, width, dtype=torch.float32, device=device)
        self.n = 0

    def append(self, rows: torch.Tensor) -> None:
        need = self.n + rows.shape[0]
        if need > self._buf.shape[0]:
            cap = max(need, 2 * self._buf.shape[0])
            grown = torch.empty(
                cap, self._buf.shape[1], dtype=self._buf.dtype, device=self._buf.device
            )
            grown[: self.n] = self._buf[: self.n]
            self._buf = grown
        self._buf[self.n : need] = rows
        self.n = need

    def view(self) -> torch.Tensor:
        return self._buf[: self.n]


@dataclass
class CompressorState:
    """State of one compressor. pending_*: [p < ratio, coff·d]; prev_*: [ratio, d] or None."""

    ratio: int
    pending_kv: torch.Tensor
    pending_score: torch.Tensor
    entries: Rows
    prev_kv: torch.Tensor | None = None
    prev_score: torch.Tensor | None = None

    @classmethod
    def create(cls, ratio: int, width: int, head_dim: int, device: torch.device) -> CompressorState:
        empty = torch.empty(0, width, dtype=torch.float32, device=device)
        return cls(ratio, empty, empty.clone(), Rows(head_dim, device))

    @property
    def n_entries(self) -> int:
        return self.entries.n


@dataclass
class LayerCache:
    """One attention layer's state. window: [w <= sliding_window - 1, D], row 0 at window_start."""

    window: torch.Tensor
    window_start: int = 0
    comp: CompressorState | None = None
    index: CompressorState | None = None


@dataclass
class ModelCache:
    """All layers' state plus the number of tokens processed so far."""

    layers: list[LayerCache] = field(default_factory=list)
    n_tokens: int = 0
