"""The decode server's state pool: a request's state buffers live in a slot, as on SGLang.

SGLang's decode server gives every request a slot of its `DecodeReqToTokenPool`
(`disaggregation/decode.py`, 0.5.13) before the transfer, and the DeepSeek-V4 state buffers are
addressed by it (0.5.14 on: the SWA ring at `req_pool_idx * ring + pos % ring`, the compress
states one ring row per request). The transfer writes the prefill server's state into the slot
and the decode reads it from there. Here:

- `decode_pool_size(max_running_requests)`: `size + pre_alloc_size` slots, with SGLang's
  `pre_alloc_size` (`model_runner_kv_cache_mixin._init_pools`): twice the size for
  `max_running_requests <= 32`, else `SGLANG_DISAGGREGATION_NUM_PRE_ALLOCATE_REQS` (0). The
  embedded engine's default of 256 running requests gives 256 slots.
- slots are handed out as `DecodeReqToTokenPool.alloc` / `free` do: the first free one, a freed
  one appended to the end of the free list. So with P slots the first P requests each get a slot
  nobody used before, and request P + 1 is the first to reuse one.
- a slot holds fixed buffers (`Buffer`): per attention layer the SWA ring [window, head_dim]
  (position mod window), each compressor's open-window ring [ratio, coff·d] and its previous
  window's half [ratio, d]; zeros until first written, as a zero-initialised pool.
- `write` puts a transfer's state buffers into the slot; `read` gives what the slot holds for a
  request of n tokens; `release` writes the request's final state into the slot (its decode
  steps wrote there) and frees it. A state buffer the transfer did not carry is read from
  whatever the slot held — zeros in a slot never used, its last occupant's rows in a reused
  one: what sglang PR #24878's decode read.

`flush_cache` does not touch the pool: the embedded server's flush empties the prefix cache
only. (SGLang's flush also resets the free list, `DecodeReqToTokenPool.clear`, so there the next
request reuses slot 1 at once; docs/reference-engine.md says what that means for a probe.)
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from dsv4bisect.reference.cache import ModelCache
from dsv4bisect.reference.pd.state import (
    COMPRESS_STATE,
    INDEXER_COMPRESS_STATE,
    STATE,
    Header,
    export,
)

# SGLang's DecodeReqToTokenPool pre-allocation (model_runner_kv_cache_mixin._init_pools, 0.5.13)
PRE_ALLOC_SMALL = 32  # at most this many running requests: pre-allocate twice as many
PRE_ALLOC_DEFAULT = 0  # SGLANG_DISAGGREGATION_NUM_PRE_ALLOCATE_REQS's default above it
POLL_S = 0.05


def decode_pool_size(max_running_requests: int) -> int:
    """Slots of the decode server's request pool: SGLang's `size + pre_alloc_size`."""
    pre = 2 * max_running_requests if max_running_requests <= PRE_ALLOC_SMALL \
        else PRE_ALLOC_DEFAULT
    return max_running_requests + pre


@dataclass(frozen=True)
class Buffer:
    """One state buffer of a slot: `kind` window (a ring over positions), pending (the open
    window, ring over position mod ratio) or prev (the previous window's half); `rows` x
    `width`; `mtp`: it follows the MTP layer's row count, not the main token count."""

    kind: str
    rows: int
    width: int
    mtp: bool = False

    def live(self, n: int) -> torch.Tensor | None:
        """The ring rows a state of n tokens (rows) occupies, in order (None: not present)."""
        if self.kind == "window":
            k = min(self.rows - 1, n)
            return torch.arange(n - k, n) % self.rows
        if self.kind == "pending":
            return torch.arange(n % self.rows)
        return torch.arange(self.rows) if n >= self.rows else None


def layout(model: Any, mtp: bool) -> dict[str, Buffer]:
    """The state buffers of one slot for `model` (name -> Buffer), as state.export names them."""
    a = model.a
    out: dict[str, Buffer] = {}
    blocks = [(f"layers.{i}", blk, False) for i, blk in enumerate(model.layers)]
    if mtp:
        blocks.append(("mtp", model.mtp[0], True))
    for prefix, blk, is_mtp in blocks:
        attn = blk.attn
        out[f"{prefix}.swa_kv"] = Buffer("window", a.sliding_window, a.head_dim, is_mtp)
        index = attn.indexer.compressor if attn.indexer is not None else None
        for where, comp in ((COMPRESS_STATE, attn.compressor), (INDEXER_COMPRESS_STATE, index)):
            if comp is None:
                continue
            for field in ("pending_kv", "pending_score"):
                out[f"{prefix}.{where}.{field}"] = Buffer("pending", comp.ratio,
                                                          comp.wkv.out_features, is_mtp)
            if comp.overlap:
                for field in ("prev_kv", "prev_score"):
                    out[f"{prefix}.{where}.{field}"] = Buffer("prev", comp.ratio,
                                                              comp.head_dim, is_mtp)
    return out


class StatePool:
    """P slots of state buffers (see the module docstring); thread-safe."""

    def __init__(self, size: int, buffers: Mapping[str, Buffer], device: torch.device) -> None:
        if size < 1:
            raise ValueError(f"a state pool needs a slot, got {size}")
        self.size, self.buffers, self.device = size, dict(buffers), device
        self._free: deque[int] = deque(range(1, size + 1))  # SGLang: row 0 is padding
        self._slots: dict[int, dict[str, torch.Tensor]] = {}
        self._occupied_before: set[int] = set()
        self._cond = threading.Condition()
        self.allocations = 0

    def alloc(self, cancelled: Callable[[], bool] = lambda: False) -> int:
        """The first free slot, waiting while none is free (SGLang's prealloc queue waits)."""
        with self._cond:
            while not self._free:
                if cancelled():
                    raise TimeoutError("cancelled while waiting for a state-pool slot")
                self._cond.wait(POLL_S)
            self.allocations += 1
            return self._free.popleft()

    def reused(self, slot: int) -> bool:
        """Whether a request held `slot` before."""
        with self._cond:
            return slot in self._occupied_before

    def write(self, slot: int, header: Header, state: Mapping[str, torch.Tensor]) -> int:
        """Put the state buffers of a request of `header` into `slot`; returns the buffers
        written (only those `state` carries)."""
        bufs = self._slot(slot)
        written = 0
        for name, spec in self.buffers.items():
            if name not in state:
                continue
            rows = spec.live(self._count(spec, header))
            if rows is None:
                continue
            bufs[name][rows] = state[name].to(self.device, torch.float32)
            written += 1
        return written

    def read(self, slot: int, header: Header) -> dict[str, torch.Tensor]:
        """The state buffers a request of `header` reads from `slot` (copies)."""
        bufs = self._slot(slot)
        out: dict[str, torch.Tensor] = {}
        for name, spec in self.buffers.items():
            if spec.mtp and header.mtp_rows is None:
                continue
            rows = spec.live(self._count(spec, header))
            if rows is not None:
                out[name] = bufs[name][rows].clone()
        return out

    def release(self, slot: int, cache: ModelCache | None) -> None:
        """The request leaves `slot`: its final state stays in the slot's buffers."""
        if cache is not None:
            mtp_rows = None if cache.mtp is None else cache.mtp.rows
            payload = export(cache, Header(cache.n_tokens, mtp_rows))
            self.write(slot, payload.header, payload.buffers[STATE])
        with self._cond:
            self._occupied_before.add(slot)
            self._free.append(slot)
            self._cond.notify_all()

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {"state_pool_slots": self.size, "state_pool_free": len(self._free),
                    "state_pool_allocations": self.allocations,
                    "state_pool_slots_used": len(self._occupied_before)}

    def _slot(self, slot: int) -> dict[str, torch.Tensor]:
        with self._cond:
            if slot not in self._slots:  # memory of a zero-initialised pool
                self._slots[slot] = {name: torch.zeros(b.rows, b.width, device=self.device)
                                     for name, b in self.buffers.items()}
            return self._slots[slot]

    @staticmethod
    def _count(spec: Buffer, header: Header) -> int:
        return int(header.mtp_rows or 0) if spec.mtp else header.n_tokens

