"""The embedded engine's recorder: every module's inputs and outputs and every tapped op's
tensors, per sequence and position (torch).

Forward pre-hooks record a module's tensor inputs, forward hooks its outputs, and the taps of
`reference/model.py` (`reference/taps.py`) the functional ops inside modules. A tensor already
recorded in the same forward (the output of `attn_norm` handed to the attention) is not
recorded again: the later site names the earlier one among its inputs. A tap that names no
inputs is fed by what the module call running it has seen so far: its inputs and every site
recorded inside it (a superset of the op's true inputs, so `inputs_multiple` errs high). The
driver tells the recorder, before each forward, which rows belong to which sequence at which
positions (`forward(layout)`): token-wise tensors have one row per token of the step; a
per-group op (`ops.Op.per_group`) is called once per sequence, in the step's order.

Rows are copied to CPU numpy (float32, or int64 for ids). With `keep` the recorder records only
the sites it accepts, and keeps their raw tensors per forward too (`raw`): the pass that saves
the first divergent op's tensors and its kernel's inputs (key pools are not position rows).
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from dsv4bisect.localise import ops
from dsv4bisect.localise.sites import Capture, Site, SiteRows
from dsv4bisect.reference import taps
from dsv4bisect.reference.swappable import Swappable


@dataclass(frozen=True)
class Rows:
    """One sequence's rows in a forward: `n` rows from position `start`."""

    seq: int
    start: int
    n: int


@dataclass
class Raw:
    """A kept site's tensors as the op produced them, per forward: (forward, seq, tensor)."""

    parts: list[tuple[int, int | None, torch.Tensor]] = field(default_factory=list)


class Recorder:
    """Install with `recording(model)`; call `forward(layout)` around each model forward."""

    def __init__(self, model: nn.Module, keep: Callable[[str], bool] | None = None) -> None:
        self.capture = Capture()
        self.keep = keep
        self.raw: dict[str, Raw] = {}
        self.forwards = 0
        self.layouts: list[tuple[Rows, ...]] = []  # each forward's rows
        self._names = {id(m): n for n, m in model.named_modules()}
        self._layout: tuple[Rows, ...] = ()
        self._calls: Counter[tuple[str, str]] = Counter()
        self._seen: dict[int, tuple[str, weakref.ref]] = {}  # tensor id -> its site, this forward
        # module calls running: (path, its input sites, the sites recorded inside it so far)
        self._stack: list[tuple[str, tuple[str, ...], list[str]]] = []

    # ---- the driver's side -------------------------------------------------------------------
    @contextmanager
    def forward(self, layout: Sequence[Rows]) -> Iterator[None]:
        self._layout = tuple(layout)
        self.layouts.append(self._layout)
        self._calls.clear()
        try:
            yield
        finally:
            self._layout = ()
            self._seen.clear()
            self._stack.clear()
            self.forwards += 1

    # ---- the model's side --------------------------------------------------------------------
    def record(self, module: Any, op: str, tensors: tuple[Any, ...], inputs: tuple[Any, ...],
               at: int | None) -> None:
        """A tap (reference/taps.py)."""
        path = self._names.get(id(module))
        if not self._layout or path is None or _skipped(path):
            return
        info = ops.op(op)
        if not info.compared and self.keep is None:
            return
        group = self._group_index(path, op) if info.per_group else None
        fed = self._inputs(path, op, inputs) if inputs else (
            tuple(dict.fromkeys((*self._stack[-1][1], *self._stack[-1][2]))) if self._stack
            else ())
        for i, t in enumerate(tensors):
            self._put(path, op, str(i), t, group, fed, at, module, info.compared)

    def pre_hook(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        path = self._names[id(module)]
        if not self._layout or _skipped(path):
            return
        name, per_group = _module_op(module)
        group = self._calls[(path, name)] if per_group else None  # counted at the output
        self._stack.append((path, self._inputs(path, name, args, group), []))

    def hook(self, module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        path = self._names[id(module)]
        if not self._layout or _skipped(path):
            return
        fed: tuple[str, ...] = ()
        if self._stack and self._stack[-1][0] == path:
            _, fed, inside = self._stack.pop()
            if self._stack:  # what was recorded inside the call, its parent saw too
                self._stack[-1][2].extend(inside)
        name, per_group = _module_op(module)
        group = self._group_index(path, name) if per_group else None
        for i, t in enumerate(out if isinstance(out, tuple) else (out,)):
            self._put(path, name, str(i), t, group, fed, None, module, True)

    # ---- internals ---------------------------------------------------------------------------
    def _group_index(self, path: str, op: str) -> int:
        k = self._calls[(path, op)]
        self._calls[(path, op)] += 1
        return k

    def _inputs(self, path: str, op: str, tensors: Sequence[Any],
                group: int | None = None) -> tuple[str, ...]:
        keys = []
        for i, t in enumerate(tensors):
            key = self._put(path, op, f"in{i}", t, group, (), None, None, True)
            if key is not None:
                keys.append(key)
        return tuple(keys)

    def _known(self, t: torch.Tensor) -> str | None:
        got = self._seen.get(id(t))
        return got[0] if got is not None and got[1]() is t else None

    def _put(self, path: str, op: str, slot: str, t: Any, group: int | None,
             fed: tuple[str, ...], at: int | None, module: Any, compared: bool) -> str | None:
        if not isinstance(t, torch.Tensor) or t.dim() == 0:
            return None
        known = self._known(t)
        if known is not None:  # the same tensor recorded already in this forward: an alias
            return known
        key = f"{path}:{op}:{slot}"
        if self.keep is not None and not self.keep(key):
            return None
        seq = None if group is None or group >= len(self._layout) else self._layout[group].seq
        if self.keep is not None:
            self.raw.setdefault(key, Raw()).parts.append((self.forwards, seq, t.detach().clone()))
        spread = self._spread(t, group, at, module) if compared else None
        if key not in self.capture.sites:
            self.capture.sites[key] = Site(key, path, op, slot, len(self.capture.sites), fed,
                                           compared and spread is not None)
            self.capture.rows[key] = SiteRows()
        for s, positions, rows in spread or ():
            self.capture.rows[key].add(s, positions, rows)
        self._seen[id(t)] = (key, weakref.ref(t))
        if self._stack:
            self._stack[-1][2].append(key)
        return key

    def _spread(self, t: torch.Tensor, group: int | None, at: int | None, module: Any
                ) -> list[tuple[int, np.ndarray, np.ndarray]] | None:
        """The tensor's rows per sequence: (seq, positions [n], rows [n, width]); None when its
        rows are not the step's tokens (a shape the layout does not explain)."""
        if group is not None:
            return self._group_rows(t, group, at, module)
        if t.shape[0] != sum(r.n for r in self._layout):
            return None
        flat, out, row = _numpy(t), [], 0
        for r in self._layout:
            out.append((r.seq, np.arange(r.start, r.start + r.n), flat[row:row + r.n]))
            row += r.n
        return out

    def _group_rows(self, t: torch.Tensor, group: int, at: int | None, module: Any
                    ) -> list[tuple[int, np.ndarray, np.ndarray]] | None:
        """A per-group op's tensor [1, rows, ...] (the driver's groups are one sequence each):
        its rows are the group's tokens, or from `at` on a compressor's entries, each placed
        at the position of the token that completes it ((w + 1)·ratio − 1)."""
        if group >= len(self._layout) or t.dim() < 2 or t.shape[0] != 1:
            return None
        r = self._layout[group]
        rows = _numpy(t[0])
        if at is not None:
            ratio = int(getattr(module, "ratio", 1))
            positions = (at + np.arange(rows.shape[0]) + 1) * ratio - 1
        elif rows.shape[0] == r.n:
            positions = np.arange(r.start, r.start + r.n)
        else:
            return None
        return [(r.seq, positions, rows)]


def _module_op(module: nn.Module) -> tuple[str, bool]:
    info = ops.module_op(type(module).__name__)
    return (info.name, info.per_group) if info else (type(module).__name__.lower(), False)


def _skipped(path: str) -> bool:
    """The root, the MTP layer (it runs outside the main forward) and a compressor's RMSNorm
    (it runs inside `absorb` on pooled windows; `compressor.entries` records what it makes)."""
    return path == "" or path.startswith("mtp.") or path.endswith("compressor.norm")


def _numpy(t: torch.Tensor) -> np.ndarray:
    flat = t.detach().reshape(t.shape[0], -1)
    if flat.is_floating_point():
        return flat.float().cpu().numpy().copy()
    return flat.long().cpu().numpy().copy()


@contextmanager
def recording(model: nn.Module, keep: Callable[[str], bool] | None = None
              ) -> Iterator[Recorder]:
    """A recorder on every module of `model` and on its taps, for the block. A swappable place
    (`reference/swappable.py`) is not a module of the model but the op's implementation: the
    tap after its call names its output, as the op table has it, whichever implementation is
    in it (a hook on it would record the same tensor first, under the place's path)."""
    rec = Recorder(model, keep)
    handles = []
    for name, module in model.named_modules():
        if not _skipped(name) and not isinstance(module, Swappable):
            handles.append(module.register_forward_pre_hook(rec.pre_hook))
            handles.append(module.register_forward_hook(rec.hook))
    try:
        with taps.recording(rec):
            yield rec
    finally:
        for h in handles:
            h.remove()
