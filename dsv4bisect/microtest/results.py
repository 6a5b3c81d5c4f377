"""Micro-test results as values: one `Row` per measured figure, a `MicrotestReport` per run.

A row has a tolerance (or none: informational) and a bound (`max`: passes when value <= tol;
`min`: passes when value >= tol). Rows of a fault variant the user did not ask for are shown for
reference but not counted (`counted=False`), and so are rows of a configuration other than the
one under test (another MoE runner, a context beyond the checkpoint's), marked `contrast`. The
run exits 1 when a counted row is outside its tolerance, 0 otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Row:
    """One figure of one check. `layers` is empty for rows that do not belong to a layer."""

    patch: str
    layers: tuple[int, ...]
    case: str  # what was measured, e.g. "attn site: comb", "ctx 32768, bf16 partials"
    metric: str  # rel_err | overlap | factor_dev | share | mismatch
    value: float
    tolerance: float | None = None
    bound: str = "max"
    counted: bool = True
    note: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict)
    contrast: str = ""  # why this row is not the configuration under test (then not counted)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "detail", MappingProxyType(dict(self.detail)))

    @property
    def within(self) -> bool | None:
        """True/False against the tolerance; None for informational rows."""
        if self.tolerance is None:
            return None
        if math.isnan(self.value):
            return False
        return self.value <= self.tolerance if self.bound == "max" else self.value >= self.tolerance

    @property
    def status(self) -> str:
        """`ok`, `FAIL`, `info`; for uncounted fault-reference rows `fault` (outside) /
        `fault-ok` (inside its tolerance); for rows of another configuration, shown for
        contrast, `contrast` / `contrast-ok`."""
        w = self.within
        if w is None:
            return "info"
        if self.contrast:
            return "contrast-ok" if w else "contrast"
        if not self.counted:
            return "fault-ok" if w else "fault"
        return "ok" if w else "FAIL"

    def to_dict(self) -> dict[str, Any]:
        return {
            "patch": self.patch, "layers": list(self.layers), "case": self.case,
            "metric": self.metric, "value": _json_float(self.value),
            "tolerance": self.tolerance, "bound": self.bound, "counted": self.counted,
            "status": self.status, "note": self.note, "detail": _jsonable(self.detail),
            "contrast": self.contrast,
        }


@dataclass(frozen=True)
class MicrotestReport:
    """Everything one run measured, and how (checkpoint, layers, contexts, device)."""

    rows: tuple[Row, ...]
    setup: Mapping[str, Any]  # checkpoint, quant map, layers, contexts, device, activations
    seconds: float = 0.0
    tensors_read: int = 0

    @property
    def failed(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.status == "FAIL")

    @property
    def contrast_outside(self) -> tuple[Row, ...]:
        """Rows of another configuration (shown for contrast) outside their tolerance."""
        return tuple(r for r in self.rows if r.status == "contrast")

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def patches(self) -> list[str]:
        seen: dict[str, None] = {}
        for r in self.rows:
            seen.setdefault(r.patch)
        return list(seen)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION, "verdict": "FAIL" if self.failed else "PASS",
            "exit_code": self.exit_code, "setup": _jsonable(self.setup),
            "seconds": round(self.seconds, 3), "tensors_read": self.tensors_read,
            "rows": [r.to_dict() for r in self.rows],
        }


def layer_ranges(layers: Sequence[int]) -> str:
    """(0, 1, 2, 5) -> "0-2,5"; () -> "-"."""
    if not layers:
        return "-"
    parts, start, prev = [], layers[0], layers[0]
    for n in [*layers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(parts)


def merge_rows(rows: Iterable[Row]) -> list[Row]:
    """Rows that differ only in their layer become one row over those layers (same case,
    value, tolerance, note and detail, so nothing is lost): keeps a 43-layer table readable."""
    out: dict[tuple[Any, ...], Row] = {}
    for r in rows:
        key = (r.patch, r.case, r.metric, _json_float(r.value), r.tolerance, r.bound, r.counted,
               r.note, repr(_jsonable(r.detail)), r.contrast)
        if key in out:
            prev = out[key]
            out[key] = Row(prev.patch, (*prev.layers, *r.layers), prev.case, prev.metric,
                           prev.value, prev.tolerance, prev.bound, prev.counted, prev.note,
                           prev.detail, prev.contrast)
        else:
            out[key] = r
    return list(out.values())


def _json_float(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return _json_float(value)
    return value
