"""Issue 41, item 7: every mark has its legend where it is printed, and the bisect's next step
(the `localise` command) is asked for in one place.

The fault mark (†) stood after a fault variant in `run`'s terminal lines and in the microtest's
tables with its legend only in report.md (or nowhere).
"""

from __future__ import annotations

from pathlib import Path

from dsv4bisect.microtest.markdown import fault_legend, render_markdown
from dsv4bisect.microtest.results import MicrotestReport, Row
from dsv4bisect.patchspec.spec import FAULT_LEGEND, FAULT_MARK
from dsv4bisect.report.run_report import RunView, terminal_lines


def run_view(faults: list[str]) -> RunView:
    arm = {"patch_set": {"mma-decode": "swa-ring-stale"}, "faults": faults, "inert": [],
           "fingerprint": "f" * 16}
    run = {"profile": "reference-all", "probe": {"tier": "ci", "spec_hash": "s", "seed_block": 0},
           "arms": {"baseline": {"patch_set": {}, "fingerprint": "0" * 16}, "candidate": arm},
           "status": "done"}
    return RunView(Path("/tmp/run-x"), run, None, {})


def test_runs_terminal_lines_carry_the_fault_marks_legend() -> None:
    lines = [text for text, _ in terminal_lines(run_view(["mma-decode"]))]
    marked = [t for t in lines if FAULT_MARK in t and t.strip() != FAULT_LEGEND]
    assert marked and "mma-decode:swa-ring-stale †" in marked[0]
    assert f"  {FAULT_LEGEND}" in lines
    plain = [text for text, _ in terminal_lines(run_view([]))]
    assert not any(FAULT_MARK in t for t in plain)  # no mark, no legend


def test_the_microtests_marked_rows_carry_the_legend() -> None:
    marked = Row("mma-decode", (2,), "bf16, merge without rescale †", "rel_err", 0.4, 0.01,
                 counted=False)
    plain = Row("mhc-bf16", (2,), "attn site: comb", "rel_err", 0.001, 0.01)
    report = MicrotestReport((plain, marked), {"checkpoint": "c", "layers": [2]})
    assert render_markdown(report).rstrip().endswith(f"{FAULT_LEGEND}.")
    assert fault_legend([plain]) is None
    assert FAULT_LEGEND not in render_markdown(MicrotestReport((plain,), {"layers": [2]}))


def test_the_localise_line_is_asked_of_the_localise_package_in_one_place() -> None:
    """`cli/bisect.py` `localise_line`: the command when `dsv4bisect.localise.command` is
    installed, else nothing (never a command that does not exist)."""
    import importlib.util

    from dsv4bisect.cli.bisect import localise_line

    class View:
        run_dir = Path("/tmp/bisect-x")

    line = localise_line(View())  # type: ignore[arg-type]
    if importlib.util.find_spec("dsv4bisect.localise") is None:
        assert line is None
    else:
        assert line == "dsv4bisect localise /tmp/bisect-x"
