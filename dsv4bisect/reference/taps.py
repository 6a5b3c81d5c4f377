"""Named functional ops of the embedded model, recorded only while something records them.

Forward hooks see every `nn.Module` call, but several of DeepSeek-V4's numerically decisive ops
are functions or tensor expressions inside a module's forward (the mHC pre/post mixes, the
sparse-attention kernel and its split-K merge, the KV write to the FP8 pages, the compressor's
entries, the indexer's scores and top-k, the MoE combine, `wo_a`'s grouped einsum). Each such
site calls `tap(module, op, tensor)` once, on one line, right after the op: it returns at once
unless a recorder is installed (`recording`), so the engine pays one global read per site.
Where a patch can put in another implementation of the op (a swappable place,
`reference/swappable.py`), the tap sits right after the place's call, so it records whichever
implementation ran.

`dsv4bisect.localise` installs the recorder; `dsv4bisect.localise.ops` names every op (what it
is, which patches and faults act on it). A tap never changes what it is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class Recorder(Protocol):
    def record(self, module: Any, op: str, tensors: tuple[Any, ...], inputs: tuple[Any, ...],
               at: int | None) -> None:
        """One op at `module` (its path gives the layer): its output tensors, where the site has
        them at hand its input tensors, and `at` for a per-group op whose rows are not the
        step's positions (compressed entries from index `at`)."""


_RECORDER: Recorder | None = None


def tap(module: Any, op: str, *tensors: Any, inputs: tuple[Any, ...] = (),
        at: int | None = None) -> None:
    """Record op `op` of `module` (its outputs `tensors`) when a recorder is installed."""
    if _RECORDER is None:
        return
    _RECORDER.record(module, op, tensors, inputs, at)


def active() -> bool:
    return _RECORDER is not None


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Install `recorder` for the block (one at a time: a nested one is a bug)."""
    global _RECORDER
    if _RECORDER is not None:
        raise RuntimeError("a tap recorder is already installed")
    _RECORDER = recorder
    try:
        yield recorder
    finally:
        _RECORDER = None
