"""Decoding state of the embedded model: sliding-window KV rows and compressor state per layer.

A prompt is processed in chunks and then one token per decode step; everything a later chunk
needs from earlier tokens lives here:
- the last `sliding_window - 1` tokens' K=V rows (a query's window includes itself),
- per compressor (the attention's, and for CSA layers the indexer's): the projections of the
  tokens of the current partial window (`pending_*`), for the overlapping CSA scheme the first
  half (Ca) of the previous complete window (`prev_*`), and every compressed entry emitted so far.
A fresh cache fed the whole prompt in one chunk is the full recompute.

`ModelCache.fork()` is the prefix cache's snapshot (reference/prefix_cache.py): tensors are never
written in place once stored here (the model replaces them), except the append-only entry rows,
which a fork shares copy-on-write. So a snapshot costs no copy when taken, and a request resumed
from it copies the entries it shares only when it appends its first new entry.

What a state holds is counted by storage (`tensors()`, `held_bytes`): a tensor keeps its whole
storage alive, so a view into a batch's activations would cost the batch. The model stores only
tensors of their own (the pending rows, the window and the MTP streams are copies, never views
of a forward's [B, T, ...] activations), and an entry buffer counts its capacity, not its rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

import torch


class Rows:
    """Rows appended to a preallocated [capacity, width] buffer that doubles when full. Forks
    share the buffer; the first append to a shared one copies it (copy-on-write)."""

    def __init__(self, width: int, device: torch.device, capacity: int = 64) -> None:
        self._buf = torch.empty(capacity, width, dtype=torch.float32, device=device)
        self.n = 0
        self._shared = [False]  # one flag per buffer, seen by every fork that shares it

    def fork(self) -> Rows:
        other = Rows.__new__(Rows)
        other._buf, other.n = self._buf, self.n
        self._shared[0] = True
        other._shared = self._shared
        return other

    def tensors(self) -> Iterator[torch.Tensor]:
        yield self._buf  # the whole buffer, capacity included: it is what stays allocated

    def append(self, rows: torch.Tensor) -> None:
        need = self.n + rows.shape[0]
        if self._shared[0]:  # rows past n may belong to another fork: write a private copy
            own = torch.empty(max(need, 2 * self.n, 64), self._buf.shape[1],
                              dtype=self._buf.dtype, device=self._buf.device)
            own[: self.n] = self._buf[: self.n]
            self._buf, self._shared = own, [False]
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

    def fork(self) -> CompressorState:
        return replace(self, entries=self.entries.fork())

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from self.entries.tensors()
        yield from _present((self.pending_kv, self.pending_score, self.prev_kv, self.prev_score))


@dataclass
class LayerCache:
    """One attention layer's state. window: [w <= sliding_window - 1, D], row 0 at window_start."""

    window: torch.Tensor
    window_start: int = 0
    comp: CompressorState | None = None
    index: CompressorState | None = None

    def fork(self) -> LayerCache:
        return LayerCache(self.window, self.window_start,
                          None if self.comp is None else self.comp.fork(),
                          None if self.index is None else self.index.fork())

    def tensors(self) -> Iterator[torch.Tensor]:
        yield self.window
        for state in (self.comp, self.index):
            if state is not None:
                yield from state.tensors()


@dataclass
class MTPState:
    """The MTP layer's state beside a main cache of n tokens (speculative decoding only).

    MTP row t reads the main model's final streams at position t and the embedding of token t+1
    (RoPE position t), so it can run once token t+1 is known. Kept in step with the main cache:
    rows 0..n-2 are in `layer` (`rows` = n - 1) and `h` [n_streams, dim] holds the main model's
    final streams of position n-1, waiting for token n (None before the first token)."""

    layer: LayerCache
    rows: int = 0
    h: torch.Tensor | None = None

    def fork(self) -> MTPState:
        return MTPState(self.layer.fork(), self.rows, self.h)

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from self.layer.tensors()
        yield from _present((self.h,))


@dataclass
class ModelCache:
    """All layers' state plus the number of tokens processed so far (and the MTP layer's state
    when the server speculates)."""

    layers: list[LayerCache] = field(default_factory=list)
    n_tokens: int = 0
    mtp: MTPState | None = None

    def fork(self) -> ModelCache:
        """An independent cache at the same point (cheap: see the module docstring)."""
        return ModelCache([layer.fork() for layer in self.layers], self.n_tokens,
                          None if self.mtp is None else self.mtp.fork())

    def tensors(self) -> Iterator[torch.Tensor]:
        """Every tensor the state holds (a storage may come more than once: forks share)."""
        for layer in self.layers:
            yield from layer.tensors()
        if self.mtp is not None:
            yield from self.mtp.tensors()

    @property
    def nbytes(self) -> int:
        """The bytes this state keeps allocated: each storage it references, whole, once."""
        return sum(held_storages(self.tensors()).values())


def storage_key(t: torch.Tensor) -> tuple[str, int]:
    """What identifies the allocation behind `t` (views of one buffer share it)."""
    st = t.untyped_storage()
    return (str(st.device), st.data_ptr())


def held_storages(tensors: Iterable[torch.Tensor]) -> dict[tuple[str, int], int]:
    """storage key -> the storage's bytes: what keeping these tensors keeps allocated."""
    return {storage_key(t): t.untyped_storage().nbytes() for t in tensors}


def _present(ts: Iterable[torch.Tensor | None]) -> Iterator[torch.Tensor]:
    return (t for t in ts if t is not None)
