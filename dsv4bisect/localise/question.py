"""A `localise` question and the pieces of its answer every comparison shares: the cases it
reads from probe runs, the ends' and cases' descriptions, a speculative round as a divergence.
(`driver.py` answers the question with `embedded.py` or `sglang_run.py`; those import this, not
the driver, so the three form no circle.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4bisect.config.resolve import Overrides
from dsv4bisect.localise import ops
from dsv4bisect.localise.cases import CaseTokens, lost_cases, probe_runs, run_drift
from dsv4bisect.localise.result import CaseInfo, Divergence, EndInfo

Progress = Callable[[str], None]
DEFAULT_CASES = 1  # the one longest case: ≤ 2 min on the 2-core CPU (docs/performance.md)


@dataclass(frozen=True)
class BisectInput:
    """What a bisect directory says (read by `bisect/localise_input.py`)."""

    run_dir: Path
    profile: str
    sets: tuple[str, ...]
    bad_patches: dict[str, str]
    culprit: tuple[str, ...]
    tier: str | None
    probe_dirs: tuple[Path, ...]  # the bad end's and its trials' probe runs, and the ends'


@dataclass(frozen=True)
class Question:
    profile: str | None = None
    overrides: Overrides = field(default_factory=Overrides)
    culprit: tuple[str, ...] | None = None
    bisect: BisectInput | None = None
    revert: str = "fault"
    tier: str | None = None
    cases: int = DEFAULT_CASES
    from_runs: tuple[Path, ...] = ()  # run directories whose lost cases to use
    out: Path = Path("runs")
    arms: tuple[str, ...] | None = None  # null arms by name (None: all)
    extra: dict[str, Any] = field(default_factory=dict)


def pick_cases(q: Question, progress: Progress) -> tuple[list[CaseTokens], list[str]]:
    """The cases that lost facts in the given runs (longest first), else their drift
    transcripts; empty when there is no run to read (the caller builds the tier's)."""
    roots = list(q.from_runs) + (list(q.bisect.probe_dirs) if q.bisect else [])
    notes: list[str] = []
    if not roots:
        return [], notes
    runs = probe_runs(roots)
    base = [r for r in runs if Path(r.path or "").name.startswith("baseline")
            and "repeat" not in Path(r.path or "").name]
    cand = [r for r in runs if r not in base and "repeat" not in Path(r.path or "").name]
    lost = sorted(lost_cases(base, cand), key=lambda c: -len(c.ids))
    progress(f"{len(lost)} case(s) lost facts in {len(cand)} bad-end probe run(s)")
    if lost:
        return lost[:q.cases], notes
    notes.append("no case lost a fact in the runs read: their drift transcripts are used")
    return sorted(run_drift(base), key=lambda c: -len(c.ids))[:q.cases], notes


def end_info(cfg: Any, settings: Any) -> EndInfo:
    from dataclasses import asdict

    return EndInfo(fingerprint=cfg.fingerprint, patches=dict(cfg.patch_set),
                   settings={k: v for k, v in asdict(settings).items() if k != "patches"})


def case_infos(cases: Sequence[CaseTokens]) -> list[CaseInfo]:
    return [CaseInfo(case_id=c.case_id, tokens=len(c.ids), prompt=len(c.prompt), why=c.why)
            for c in cases]


def spec_divergence(round_: Any) -> Divergence:
    info = ops.op(round_.op)
    return Divergence(layer=None, module="speculative", op=round_.op, what=info.what,
                      kind="spec", multiple=None, inputs_multiple=None, case=round_.case_id,
                      positions=[round_.emitted_before], acts_on=list(info.acts_on),
                      detail=round_.to_dict())
