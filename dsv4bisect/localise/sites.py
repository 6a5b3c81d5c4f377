"""What a capture holds: sites (one tensor of one op at one module) and their rows by position.

A site is keyed `module:op:slot` (`layers.3.attn:attn.sparse_attention:0`, the inputs of a module
`layers.0.attn:attention:in0`). Its rows are kept per sequence and position, so two runs that
chunked or batched the same tokens differently are compared row for row. The embedded engine's
recorder (`capture.py`) and the SGLang dump loader (`sglang_dumps.py`) both produce a `Capture`.
Pure numpy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def layer_of(module: str) -> int | None:
    m = _LAYER.search(module)
    return int(m.group(1)) if m else None


@dataclass
class Site:
    key: str
    module: str
    op: str
    slot: str  # "0", "1", ... an output; "in0", ... an input
    order: int  # execution order: when the site was first recorded
    inputs: tuple[str, ...] = ()  # the sites that feed it
    compared: bool = True

    @property
    def layer(self) -> int | None:
        return layer_of(self.module)

    @property
    def is_input(self) -> bool:
        return self.slot.startswith("in")


@dataclass
class SiteRows:
    """Rows of one site: per sequence, positions [n] and rows [n, width] (float32 or int64)."""

    parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    _done: dict[int, tuple[np.ndarray, np.ndarray]] | None = None

    def add(self, seq: int, positions: np.ndarray, rows: np.ndarray) -> None:
        self.parts.setdefault(seq, []).append((positions, rows))
        self._done = None

    def by_seq(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per sequence: positions ascending (a position recorded twice keeps its last rows)
        and the rows, padded to one width (-inf for float rows that grew, e.g. indexer scores
        over more entries; -1 for ids)."""
        if self._done is None:
            self._done = {seq: _merge(parts) for seq, parts in self.parts.items()}
        return self._done


def _merge(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    width = max(r.shape[1] for _, r in parts)
    floating = np.issubdtype(parts[0][1].dtype, np.floating)
    fill = -np.inf if floating else -1
    rows = np.concatenate([r if r.shape[1] == width else
                           np.pad(r, ((0, 0), (0, width - r.shape[1])), constant_values=fill)
                           for _, r in parts])
    pos = np.concatenate([p for p, _ in parts])
    order = np.argsort(pos, kind="stable")
    pos, rows = pos[order], rows[order]
    keep = np.ones(len(pos), dtype=bool)  # the last of equal positions
    keep[:-1] = pos[1:] != pos[:-1]
    return pos[keep], rows[keep]


@dataclass
class Capture:
    """Every site of one run, in execution order, and the tokens it ran (per sequence)."""

    sites: dict[str, Site] = field(default_factory=dict)
    rows: dict[str, SiteRows] = field(default_factory=dict)
    tokens: dict[int, np.ndarray] = field(default_factory=dict)  # seq -> token ids it ran
    label: str = ""

    def ordered(self) -> list[Site]:
        return sorted(self.sites.values(), key=lambda s: s.order)

    def site_rows(self, key: str, seq: int) -> tuple[np.ndarray, np.ndarray] | None:
        got = self.rows.get(key)
        return None if got is None else got.by_seq().get(seq)


def divergence(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Per row: float rows, ‖other − ref‖ / ‖ref‖ (non-finite entries equal on both sides
    count as equal, a non-finite on one side only as a whole row's difference); id rows, the
    share of ids that differ as sets (an indexer's or router's picks in another order are the
    same picks). ref, other [n, w] -> [n] float64."""
    if ref.shape[1] != other.shape[1]:  # padded to different widths: compare the common part
        w = min(ref.shape[1], other.shape[1])
        ref, other = ref[:, :w], other[:, :w]
    if not np.issubdtype(ref.dtype, np.floating):
        if not ref.shape[1]:
            return np.zeros(len(ref))
        found = (ref[:, :, None] == other[:, None, :]).any(axis=2)  # [n, w]: in the other set
        return 1.0 - found.mean(axis=1)
    fin_r, fin_o = np.isfinite(ref), np.isfinite(other)
    if fin_r.all() and fin_o.all():
        mismatch = np.zeros(len(ref), dtype=bool)
        r, o = ref, other
    else:
        mismatch = ((fin_r != fin_o) | (~fin_r & ~fin_o & (ref != other))).any(axis=1)
        r, o = np.where(fin_r, ref, 0.0), np.where(fin_o, other, 0.0)
    # fp32 norms: a relative change is resolved far below FLOOR (2^-20) this way
    num = np.linalg.norm(o - r, axis=1).astype(np.float64)
    den = np.linalg.norm(r, axis=1).astype(np.float64)
    d = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, 1.0, 0.0))
    return np.where(mismatch, np.maximum(d, 1.0), d)


@dataclass(frozen=True)
class Compared:
    """One site of a run against the reference run: the positions both computed, per
    sequence, and each one's divergence."""

    seqs: np.ndarray  # [n] int
    positions: np.ndarray  # [n] int
    d: np.ndarray  # [n] float64


def compare_site(ref: Capture, other: Capture, key: str) -> Compared | None:
    """The site `key` of `other` against `ref`, position by position (None: not in both)."""
    a, b = ref.rows.get(key), other.rows.get(key)
    if a is None or b is None:
        return None
    seqs, positions, ds = [], [], []
    rb = b.by_seq()
    for seq, (pa, ra) in a.by_seq().items():
        if seq not in rb:
            continue
        pb, rb_rows = rb[seq]
        common, ia, ib = np.intersect1d(pa, pb, assume_unique=True, return_indices=True)
        if not len(common):
            continue
        seqs.append(np.full(len(common), seq))
        positions.append(common)
        ds.append(divergence(ra[ia], rb_rows[ib]))
    if not ds:
        return None
    return Compared(np.concatenate(seqs), np.concatenate(positions), np.concatenate(ds))
