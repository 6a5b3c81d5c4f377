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


KEPT = Path(__file__).resolve().parents[1] / "localise" / "data" / "bisect-scale-layout"


def test_after_a_found_bisect_the_terminal_has_every_next_step(tmp_path: Path) -> None:
    """A real bisect's directory (the kept scale-layout bisect, tests/localise/data): the
    terminal lines carry every Reproduce line and the culprit alone, and the localise command
    comes from the one place that asks for it."""
    import shutil

    from dsv4bisect.bisect.report import load_bisect
    from dsv4bisect.bisect.report import terminal_lines as bisect_lines
    from dsv4bisect.cli.bisect import localise_line

    shutil.copytree(KEPT, tmp_path / "runs")
    run_dir = next(p for p in (tmp_path / "runs").iterdir() if (p / "bisect.json").is_file())
    view = load_bisect(run_dir)
    text = [t for t, _ in bisect_lines(view)]
    assert text[0].startswith("FOUND  culprit {fp8-wo-a-gemm (variant scale-layout)}")
    assert sum(t.startswith("  step ") for t in text) == len(view.steps) > 0
    (alone,) = [t for t in text if t.startswith("the culprit alone: ")]
    assert "--set patches.fp8-wo-a-gemm.variant=scale-layout --only fp8-wo-a-gemm" in alone
    assert localise_line(view) == f"dsv4bisect localise {run_dir}"
