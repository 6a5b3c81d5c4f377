"""Start the candidate's accuracy requests before the baseline has finished.

A candidate replays the baseline's cases (its conversations, built on the good end in the
server's own tokens) and scores the baseline's drift transcripts. Only the transcripts need the
baseline's answers; the cases exist as soon as they are built. So on the embedded engine, while
the baseline is probed, the candidate builds the cases on its own engine (`case_reference`: the
same spec, seed block and tokenizer give byte-identical cases; `same_cases` checks them against
the baseline's afterwards, and a mismatch re-probes the candidate with the baseline's cases) and
probes its accuracy requests; then it scores the baseline's drift transcripts
(`drift_reference`). `merge` joins the two parts into the one `ProbeRun` a single collect would
have produced: same rows in the same order.
"""

from __future__ import annotations

from dataclasses import replace

from dsv4bisect.probe.client import ProbeClient
from dsv4bisect.probe.run import ProbeRun

# The cases of a baseline collect, exactly as `collect` builds them (its lengths filter and
# compression-ratio fallback included). runner.py keeps this private; see docs/run.md.
from dsv4bisect.probe.runner import Progress, _build
from dsv4bisect.probe.spec import ProbeSpec


def case_reference(url: str, spec: ProbeSpec, *, api_key: str | None = None,
                   model: str | None = None, on_progress: Progress | None = None) -> ProbeRun:
    """A rows-less run holding the cases a baseline collect on `url` builds (never saved)."""
    client = ProbeClient(url, api_key=api_key, timeout_s=spec.timeout_s, retries=spec.retries,
                         model=model)
    try:
        server = client.describe()
        notes: list[str] = []
        cases = _build(client, spec, server, notes, on_progress)
    finally:
        client.close()
    return ProbeRun(spec, url, {"model": server.model}, tuple(cases), (), (), tuple(notes))


def same_cases(a: ProbeRun, b: ProbeRun) -> bool:
    return [c.to_dict() for c in a.cases] == [c.to_dict() for c in b.cases]


def drift_reference(base: ProbeRun) -> ProbeRun | None:
    """The baseline restricted to its drift cases and transcripts (None: no drift family)."""
    cases = tuple(c for c in base.cases if c.family == "drift")
    if not cases or not base.drift:
        return None
    return replace(base, cases=cases, rows=tuple(r for r in base.rows if r["family"] == "drift"))


def merge(base: ProbeRun, accuracy: ProbeRun, drift: ProbeRun | None) -> ProbeRun:
    """One candidate run from its accuracy part and its drift part (rows in collect's order)."""
    rows = accuracy.rows + (drift.rows if drift else ())
    notes = tuple(dict.fromkeys((*accuracy.notes, *(drift.notes if drift else ()))))
    total = accuracy.timing.get("total_s", 0.0) + (drift.timing.get("total_s", 0.0) if drift
                                                   else 0.0)
    timing = {"build_s": 0.0, "total_s": round(total, 3),
              "accuracy_s": accuracy.timing.get("total_s", 0.0),
              "drift_s": drift.timing.get("total_s", 0.0) if drift else 0.0}
    return replace(accuracy, cases=base.cases, rows=rows, drift=drift.drift if drift else (),
                   notes=notes, timing=timing, path=None)
