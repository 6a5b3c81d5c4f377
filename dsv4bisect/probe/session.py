"""Probe a running candidate against a baseline server or a saved baseline run.

The output directory holds `baseline/`, `baseline-repeat/` (the A/A noise floor) and
`candidate/` (each a `ProbeRun` directory) and `verdict.json`. A saved baseline is a directory
holding `baseline/` and, when present, `baseline-repeat/` — such an output directory, or the run
directory of a `dsv4bisect run` (the same two folders, the good end's null model in
`baseline/null.jsonl`) — or one `ProbeRun` directory; a `baseline/` folder brings its sibling
`baseline-repeat/` along, so `RUN/baseline` keeps the A/A repeat too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsv4bisect.base.atomic import write_json
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import ProbeProgress, collect, judge
from dsv4bisect.probe.spec import ProbeSpec, tier_spec
from dsv4bisect.probe.verdict import Verdict

DEFAULT_TIER = "smoke"
BASELINE, REPEAT = "baseline", "baseline-repeat"  # the folders of a probe's or a run's output
StageProgress = Callable[[str, ProbeProgress], None]


@dataclass(frozen=True)
class ProbeSession:
    baseline: ProbeRun
    repeat: ProbeRun | None
    candidate: ProbeRun
    verdict: Verdict
    out_dir: Path


@dataclass(frozen=True)
class BaselineSource:
    spec: ProbeSpec
    url: str | None  # a live baseline server
    run: ProbeRun | None = None  # or a saved one
    repeat: ProbeRun | None = None


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def resolve_baseline(baseline: str, tier: str | None, families: tuple[str, ...] | None,
                     warmup_requests: int | None = None) -> BaselineSource:
    """Turn `--baseline URL|RUN_DIR` (+ tier, families, polluting phase) into a spec and a
    source."""
    if is_url(baseline):
        spec = tier_spec(tier or DEFAULT_TIER, families=families)
        if warmup_requests is not None:
            spec = spec.replace(warmup_requests=warmup_requests)
        return BaselineSource(spec, baseline)
    run, repeat = _saved_baseline(Path(baseline))
    spec = run.spec
    if tier is not None and tier != spec.tier:
        raise ConfigError(f"the saved baseline was probed with tier `{spec.tier}`, not `{tier}`",
                          f"drop --tier, or pass --tier {spec.tier}")
    if families is not None and tuple(families) != spec.families:
        raise ConfigError(f"the saved baseline covers families {','.join(spec.families)}",
                          "drop --families to use the baseline's families")
    if warmup_requests is not None and warmup_requests != spec.warmup_requests:
        raise ConfigError(f"the saved baseline was probed after a polluting phase of "
                          f"{spec.warmup_requests} requests, not {warmup_requests}",
                          "drop --warmup-requests to use the baseline's")
    return BaselineSource(spec, None, run, repeat)


def _saved_baseline(root: Path) -> tuple[ProbeRun, ProbeRun | None]:
    """(baseline, A/A repeat or None) from a run or output directory, or one probe run."""
    if (root / BASELINE / "run.json").is_file():
        base_dir = root / BASELINE
    elif (root / "run.json").is_file() and (root / BASELINE).is_dir():
        raise ConfigError(f"--baseline `{root}`: the run has no measured baseline "
                          f"({BASELINE}/run.json is missing: it ended before its good end was "
                          "probed)", f"pass a run that finished (`dsv4bisect report {root}` "
                          "says how it ended), or a URL of the good server")
    elif (root / "run.json").is_file():
        base_dir = root
    else:
        raise ConfigError(f"--baseline `{root}` is neither a URL nor a probe run directory",
                          "pass http://HOST:PORT of the good server, a run directory of "
                          "`dsv4bisect run`, or a directory written by `dsv4bisect probe --out`")
    run = ProbeRun.load(base_dir)
    rep_dir = base_dir.parent / REPEAT if base_dir.name == BASELINE else None
    repeat = ProbeRun.load(rep_dir) if rep_dir and (rep_dir / "run.json").is_file() else None
    if repeat is not None and repeat.spec.spec_hash() != run.spec.spec_hash():
        raise ConfigError(f"--baseline `{root}`: {rep_dir} was probed with another spec than "
                          f"{base_dir}", "pass the baseline folder of one run or probe")
    return run, repeat


def probe_against(url: str, source: BaselineSource, out_dir: str | os.PathLike[str], *,
                  api_key: str | None = None,
                  on_progress: StageProgress | None = None) -> ProbeSession:
    """Collect baseline (+ A/A repeat) when live, then the candidate; save all; judge."""
    out = Path(out_dir)

    def stage(name: str) -> Callable[[ProbeProgress], None] | None:
        return (lambda p: on_progress(name, p)) if on_progress else None

    if source.url is not None:
        base = collect(source.url, source.spec, api_key=api_key,
                       on_progress=stage("baseline")).save(out / BASELINE)
        repeat: ProbeRun | None = collect(
            source.url, source.spec, reference_run=base, api_key=api_key,
            on_progress=stage("A/A repeat")).save(out / REPEAT)
    else:
        assert source.run is not None  # resolve_baseline gives a url or a run
        base, repeat = source.run, source.repeat
    cand = collect(url, source.spec, reference_run=base, api_key=api_key,
                   on_progress=stage("candidate")).save(out / "candidate")
    verdict = judge(base, repeat, cand).with_evidence(
        baseline=base.path, baseline_repeat=repeat.path if repeat else None,
        candidate=cand.path)
    write_verdict(out, verdict)
    return ProbeSession(base, repeat, cand, verdict, out)


def write_verdict(out_dir: str | os.PathLike[str], verdict: Verdict) -> Path:
    return write_json(Path(out_dir) / "verdict.json", verdict.to_dict())
