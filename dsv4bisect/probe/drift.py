"""Teacher-forced drift: the same token ids scored on two configurations.

A `DriftRecord` holds, for each scored position of one transcript (prompt + the baseline's
answer), the logprob of the actual token and the server's top-k. Servers return only the top-k,
so KL is computed over the union of both top-k sets plus one tail bucket per side: a token
missing from one side's list gets min(that side's smallest listed probability, its tail mass /
(missing + 1)); whatever tail mass is left forms the bucket. Identical lists give exactly 0.

Metrics (llama.cpp `--kl-divergence` style): mean and p99 KL(baseline ‖ other), top-1 agreement
("same top p"), the first position whose top-1 differs, and per absolute position bucket
(near vs far context) the mean KL, top-1 agreement and mean NLL of the actual tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsv4bisect.errors import ProbeError

# Position bucket lower edges: doubling from 256, so a fault that grows with context shows in
# the far buckets even when the near ones dilute the overall mean.
POSITION_BUCKETS = (0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
_TINY = 1e-12
NON_FINITE = "non_finite"  # the hard signature of a server that returned NaN/±inf scores


class NonFiniteScores(ProbeError):
    """The server computed NaN or ±inf logprobs. Not malformed input: a real engine produced
    them (a NaN decode is a field failure, sglang#25704), so it is evidence about the
    configuration that served them — a FAIL from a candidate, never agreement."""


def check_finite(values: Sequence[float], where: str) -> None:
    """Raise NonFiniteScores naming the first non-finite value (NaN compares equal to nothing
    and `max(0.0, nan)` is 0: one NaN would otherwise read as perfect agreement)."""
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise NonFiniteScores(f"{where}: logprob {v!r} at scored position {i}",
                                  "the configuration computes non-finite logits")


def non_finite_cases(rows: Any) -> list[str]:
    """Case ids of the rows a server scored with NaN/±inf logprobs (probe rows, any run)."""
    return sorted({str(r.get("case_id")) for r in rows
                   if isinstance(r, dict) and NON_FINITE in (r.get("signatures") or ())})


def non_finite_reason(who: str, cases: Sequence[str]) -> str:
    shown = ", ".join(cases[:4]) + ("…" if len(cases) > 4 else "")
    return (f"{who} computed non-finite logprobs (NaN/inf) on {len(cases)} drift "
            f"transcript{'s' if len(cases) != 1 else ''} ({shown}): hard signature "
            f"`{NON_FINITE}` (a NaN decode, sglang#25704)")


@dataclass(frozen=True)
class DriftRecord:
    """Teacher-forced scores of one transcript on one server."""

    case_id: str
    input_ids: tuple[int, ...]
    start: int  # first scored position
    positions: tuple[int, ...]
    token_logprobs: tuple[float, ...]
    top: tuple[tuple[tuple[int, float], ...], ...]  # per position: (token id, logprob), best first
    answer_start: int | None = None  # first position of the baseline's answer (None: unknown)

    def to_dict(self) -> dict[str, Any]:
        out = {"case_id": self.case_id, "input_ids": list(self.input_ids), "start": self.start,
               "positions": list(self.positions), "token_logprobs": list(self.token_logprobs),
               "top": [[[i, lp] for i, lp in t] for t in self.top]}
        return out if self.answer_start is None else {**out, "answer_start": self.answer_start}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DriftRecord:
        answer = d.get("answer_start")
        return cls(d["case_id"], tuple(d["input_ids"]), int(d["start"]), tuple(d["positions"]),
                   tuple(float(x) for x in d["token_logprobs"]),
                   tuple(tuple((int(i), float(lp)) for i, lp in t) for t in d["top"]),
                   None if answer is None else int(answer))


def _side(top: dict[int, float], union: set[int]) -> list[float]:
    """Probabilities over sorted(union) + [tail], filling tokens this side did not list."""
    probs = {t: math.exp(lp) for t, lp in top.items()}
    tail = max(0.0, 1.0 - sum(probs.values()))
    missing = [t for t in union if t not in probs]
    fill = min(min(probs.values(), default=tail), tail / (len(missing) + 1)) if missing else 0.0
    out = [probs.get(t, fill) for t in sorted(union)]
    return [*out, max(0.0, tail - fill * len(missing))]


def position_kl(p_top: dict[int, float], q_top: dict[int, float]) -> float:
    """KL(P ‖ Q) in nats over the top-k union plus a tail bucket."""
    union = set(p_top) | set(q_top)
    p, q = _side(p_top, union), _side(q_top, union)
    return max(0.0, sum(pi * math.log(pi / max(qi, _TINY)) for pi, qi in zip(p, q) if pi > 0))


def _argmax(top: Sequence[tuple[int, float]]) -> int | None:
    return min(top, key=lambda t: (-t[1], t[0]))[0] if top else None


@dataclass(frozen=True)
class DriftComparison:
    """One transcript, reference vs other, position by position."""

    case_id: str
    kl: tuple[float, ...]
    top1_same: tuple[bool, ...]
    first_divergence: int | None  # transcript position of the first top-1 disagreement
    positions: tuple[int, ...]
    nll_ref: tuple[float, ...]
    nll_other: tuple[float, ...]
    answer_start: int | None = None  # the reference's: positions from here score the answer


def compare(ref: DriftRecord, other: DriftRecord) -> DriftComparison:
    """Compare two records of the same transcript (positions are matched by index)."""
    if ref.input_ids != other.input_ids:
        raise ValueError(f"drift case {ref.case_id}: the two records scored different token ids")
    for name, rec in (("reference", ref), ("other", other)):
        check_finite([*rec.token_logprobs, *(lp for t in rec.top for _, lp in t)],
                     f"drift case {rec.case_id} ({name})")
    other_at = {p: i for i, p in enumerate(other.positions)}
    kl, same, pos, nll_r, nll_o = [], [], [], [], []
    first = None
    for i, p in enumerate(ref.positions):
        j = other_at.get(p)
        if j is None:
            continue
        a, b = ref.top[i], other.top[j]
        kl.append(position_kl(dict(a), dict(b)))
        agree = _argmax(a) == _argmax(b)
        same.append(agree)
        if not agree and first is None:
            first = p
        pos.append(p)
        nll_r.append(-ref.token_logprobs[i])
        nll_o.append(-other.token_logprobs[j])
    return DriftComparison(ref.case_id, tuple(kl), tuple(same), first, tuple(pos),
                           tuple(nll_r), tuple(nll_o), ref.answer_start)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty sequence."""
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@dataclass(frozen=True)
class DriftSummary:
    n_cases: int
    n_positions: int
    kl_mean: float
    kl_p99: float
    kl_max: float
    top1_agreement: float
    first_divergence: int | None  # earliest over cases
    cases_diverged: int
    by_position: dict[str, dict[str, float]]  # "512-1023": {n, kl_mean, top1_agreement, nll_*}

    def to_dict(self) -> dict[str, Any]:
        return {"n_cases": self.n_cases, "n_positions": self.n_positions,
                "kl_mean": self.kl_mean, "kl_p99": self.kl_p99, "kl_max": self.kl_max,
                "top1_agreement": self.top1_agreement, "first_divergence": self.first_divergence,
                "cases_diverged": self.cases_diverged, "by_position": self.by_position}


def bucket_of(pos: int) -> str:
    """The position bucket label, e.g. '512-1023' (edges in POSITION_BUCKETS)."""
    lo = max(e for e in POSITION_BUCKETS if e <= pos)
    nxt = [e for e in POSITION_BUCKETS if e > lo]
    return f"{lo}-{nxt[0] - 1}" if nxt else f"{lo}+"


def _by_position(comparisons: Sequence[DriftComparison]) -> dict[str, dict[str, float]]:
    sums: dict[str, list[float]] = {}
    for c in comparisons:
        for p, k, same, r, o in zip(c.positions, c.kl, c.top1_same, c.nll_ref, c.nll_other):
            acc = sums.setdefault(bucket_of(p), [0.0] * 5)
            for i, x in enumerate((1.0, k, float(same), r, o)):
                acc[i] += x
    out = {}
    for key in sorted(sums, key=lambda k: int(k.split("-")[0].rstrip("+"))):
        n, kl, same, r, o = sums[key]
        out[key] = {"n": int(n), "kl_mean": kl / n, "top1_agreement": same / n,
                    "nll_ref": r / n, "nll_other": o / n, "nll_delta": (o - r) / n}
    return out


def summarise(comparisons: Sequence[DriftComparison]) -> DriftSummary | None:
    """Pool the positions of all transcripts; None when nothing was scored."""
    kl = [x for c in comparisons for x in c.kl]
    if not kl:
        return None
    same = [x for c in comparisons for x in c.top1_same]
    firsts = [c.first_divergence for c in comparisons if c.first_divergence is not None]
    return DriftSummary(len(comparisons), len(kl), sum(kl) / len(kl), percentile(kl, 99),
                        max(kl), sum(same) / len(same), min(firsts) if firsts else None,
                        len(firsts), _by_position(comparisons))
