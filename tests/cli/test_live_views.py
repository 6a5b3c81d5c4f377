"""Issue 31, item 8: the live views. An engine's "last log line" is what the engine last did,
not the launcher's own readiness poll; a check of the good end is labelled as the good end,
not "candidate requests"; at 80 columns a bisect's step line keeps its outcome."""

from __future__ import annotations

from pathlib import Path

from dsv4bisect.cli.bisect_display import step_line
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.engines.logs import last_line
from dsv4bisect.probe.runner import ProbeProgress
from dsv4bisect.run.ends import Ends
from dsv4bisect.run.trial import Trial


def test_the_last_log_line_skips_the_launchers_readiness_polls(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "2026-12-02 01:14:50,100 INFO loading checkpoint embedded\n"
        "2026-12-02 01:14:52,601 INFO ready: 6,691,409 parameters\n"
        "2026-12-02 01:14:52,700 INFO GET /health_generate 200 0.5ms\n"
        'INFO:     127.0.0.1:53412 - "GET /health_generate HTTP/1.1" 200 OK\n'
        'INFO:     127.0.0.1:53412 - "GET /health HTTP/1.1" 200 OK\n\n')
    assert last_line(log, ("/health_generate",)) == \
        "2026-12-02 01:14:52,601 INFO ready: 6,691,409 parameters"
    log.write_text("INFO GET /healthz 200\nINFO GET /v1/models 200\n")  # not a poll of ours
    assert last_line(log, ("/health_generate",)) == "INFO GET /v1/models 200"
    assert last_line(tmp_path / "missing.log") == ""


def test_a_step_line_keeps_its_outcome_at_80_columns() -> None:
    subset = "{hash-topk-scaling, mhc-bf16, mma-decode, nvfp4-dispatch, triton-indexer}"
    line = step_line("step 1", subset, "fail (from the ledger)", 80)
    assert len(line) <= 80 and line.endswith("-> fail (from the ledger)")
    assert line.startswith("step 1: {hash-topk-scaling, ") and "more}" in line
    assert step_line("step 1", subset, "fail", 200) == f"step 1: {subset} -> fail"
    assert step_line("step 0", "good end", "pass", 10) == "step 0: good end -> pass"


def test_the_good_ends_requests_are_labelled_as_the_good_ends() -> None:
    events: list = []
    good = resolve("reference")
    cand = resolve("reference-all")
    tick = ProbeProgress("probe", 1, 40, 10.0, 1, 1)
    for candidate, want in ((good, "good end"), (cand, "candidate")):
        trial = Trial(Ends(good, candidate, Overrides()), None, Path("."), None, None,  # type: ignore[arg-type]
                      events.append, None, False)
        trial._progress("candidate")(tick)
        assert events[-1].stage == want
