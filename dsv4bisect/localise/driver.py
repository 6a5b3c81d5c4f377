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
from pathlib import Path

from dsv4bisect.base import atomic
from dsv4bisect.errors import ConfigError
from dsv4bisect.localise.ends import Ends, bisect_ends, profile_ends
from dsv4bisect.localise.question import BisectInput, Progress, Question, pick_cases
from dsv4bisect.localise.result import LocaliseResult
from dsv4bisect.localise.settings import EmbeddedSettings

__all__ = ["BisectInput", "Question", "localise", "pick_cases", "resolve_ends"]


def resolve_ends(q: Question) -> Ends:
    if q.bisect is not None:
        b = q.bisect
        return bisect_ends(b.profile, b.sets, b.bad_patches, b.culprit, q.revert)
    if q.profile is None:
        raise ConfigError("localise needs a profile or a bisect directory",
                          "dsv4bisect localise PROFILE --only P, or localise BISECT_DIR")
    return profile_ends(q.profile, q.overrides, culprit=q.culprit, revert=q.revert)


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
