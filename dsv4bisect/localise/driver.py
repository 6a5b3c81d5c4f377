"""`localise`'s domain entry: a `Question` in, a `LocaliseResult` and its report directory out.

The ends come from `ends.py` (a profile with flags, or a bisect's bad end and culprit), the
tokens from `cases.py` (the cases that lost facts, else drift transcripts), the comparison from
`embedded.py` (the embedded engine, in-process) or `sglang_run.py` (SGLang through its dumper).
The first divergence is the activation path's when it has one (it shows in a cold run), else
the state check's (a prefix-cache restore), else the speculative check's; each keeps its own
key in the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4bisect.base import atomic
from dsv4bisect.config.resolve import Overrides
from dsv4bisect.errors import ConfigError
from dsv4bisect.localise import ops
from dsv4bisect.localise.cases import CaseTokens, lost_cases, probe_runs, run_drift
from dsv4bisect.localise.ends import Ends, bisect_ends, profile_ends
from dsv4bisect.localise.result import CaseInfo, Divergence, EndInfo, LocaliseResult
from dsv4bisect.localise.settings import EmbeddedSettings

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


def resolve_ends(q: Question) -> Ends:
    if q.bisect is not None:
        b = q.bisect
        return bisect_ends(b.profile, b.sets, b.bad_patches, b.culprit, q.revert)
    if q.profile is None:
        raise ConfigError("localise needs a profile or a bisect directory",
                          "dsv4bisect localise PROFILE --only P, or localise BISECT_DIR")
    return profile_ends(q.profile, q.overrides, culprit=q.culprit, revert=q.revert)


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


def localise(q: Question, progress: Progress = lambda _: None) -> tuple[LocaliseResult, Path]:
    """Answer `q`; write its report directory under `q.out`; return the result and the dir."""
    from dsv4bisect.base.unique_dir import make_unique_dir

    t0 = time.perf_counter()
    ends = resolve_ends(q)
    progress(f"good end: {ends.how}; culprit: {ends.culprit.describe()}")
    if ends.bad.kind == "sglang":
        from dsv4bisect.localise.sglang_run import localise_sglang

        return localise_sglang(q, ends, progress)
    good, bad = EmbeddedSettings.from_config(ends.good), EmbeddedSettings.from_config(ends.bad)
    cases, notes = pick_cases(q, progress)
    out = make_unique_dir(Path(q.out), "localise")
    from dsv4bisect.localise.embedded import localise_embedded

    result = localise_embedded(q, ends, good, bad, cases, out, notes, progress)
    result.seconds["total"] = round(time.perf_counter() - t0, 1)
    atomic.write_json(out / "localise.json", result.to_json())
    from dsv4bisect.localise.report import markdown

    atomic.write_text(out / "report.md", markdown(result))
    return result, out


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
