"""Issue 41, items 4, 7 and 10 (posterior.png): one vocabulary from trial to headline.

A drift-only bisect used to label its trials FAIL beside "drift warn … top-1 100.0 %" while the
pasted line printed WARN and exited 0; its hypothesis table led with `unexplained` under a
SEVERAL headline that named {hash-topk-scaling, mhc-bf16} as equals (ranked by share, each
culprit's drift is compared in the bad end's own view); FOUND named no variant; posterior.png counted from the
prior while the terminal counts from the good end's trial 0. The views below are the shape a
real ledger gives (`load_bisect`), with the figures of the issue's bisect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsv4bisect.bisect.report import (
    BisectView,
    StepView,
    counted_text,
    culprit_lines,
    headline,
    posterior_figure,
    render_markdown,
    report_json,
    reproduce,
    run_word,
    terminal_lines,
)
from dsv4bisect.bisect.spec import BisectSpec

CANDIDATES = ("mhc-bf16", "hash-topk-scaling", "mma-decode")
BAD = {"mhc-bf16": "bf16", "hash-topk-scaling": "double-scale", "mma-decode": "split-k"}
HOT = {"policy": {"warn_as": "auto", "drift": "absolute", "hot": True, "sequential": True,
                  "shard": False, "executor": "local"}}


def line(patches: dict[str, str]) -> str:
    sets = " ".join(f"--set patches.{n}.variant={v}" for n, v in patches.items())
    return f"dsv4bisect run reference-all --tier smoke {sets} --only {','.join(patches) or 'none'}"


ANSWER, ALL = "answer positions", "all positions"


def step(n: int, subset: tuple[str, ...], verdict: str, outcome: str, status: str,
         answer_kl: float, all_kl: float) -> StepView:
    """A trial as the ledger keeps it: its drift in the view that triggered it (the answer
    positions where it warns), and its mean KL in every view."""
    patches = {c: BAD[c] for c in subset}
    where = ANSWER if status == "warn" else ALL
    views = {ANSWER: answer_kl, ALL: all_kl}
    details: dict[str, Any] = {"drift": {"status": status, "where": where,
                                         "kl_mean": views[where], "top1_agreement": 1.0,
                                         "kl_by_view": views},
                               "command": line(patches), "mode": "hot"}
    signature = "drift" if outcome != "pass" else None
    return StepView(n, subset, patches, 0, outcome, signature, verdict, "run", 1, 10.0,
                    details, n + 1)


def view(status: str, culprits: list[str], steps: tuple[StepView, ...],
         bad: dict[str, str] = BAD, top: tuple[tuple[str, float], ...] = ()) -> BisectView:
    result = {"status": status, "culprits": culprits, "posterior": top[0][1] if top else 0.99,
              "message": "the search's own sentence", "checks": [], "remedy": None,
              "confirmation": None,
              "top": [{"hypothesis": h, "posterior": p} for h, p in top]}
    spec = BisectSpec(candidates=tuple(bad), good={}, bad=bad)
    history = tuple({h: p for h, p in top} for _ in range(len(steps) + 1))
    return BisectView(Path("/tmp/bisect-x"), "run-1", {"profile": "reference-all", **HOT},
                      spec, "done", result, steps, len(steps), history, "ledger.sqlite")


@pytest.fixture
def several() -> BisectView:
    """The issue's bisect as the embedded engine measured it (tests/bisect/
    test_drift_bisect_e2e.py, the ledger's figures): the bad end drifts, WARN in the answer
    positions, no fact lost. Over all positions the fault alone carries 96 % of the bad end's
    drift and mhc-bf16 alone 21 %; in the answer positions, the view that set the bad end's
    verdict, both come near it (93 %, 98 %): read there alone, mhc-bf16 came first."""
    steps = (step(0, (), "PASS", "pass", "pass", 0.0, 0.0),
             step(1, CANDIDATES, "WARN", "fail", "warn", 2.59e-4, 0.716),
             step(2, ("hash-topk-scaling",), "FAIL", "fail", "warn", 2.40e-4, 0.69),
             step(3, ("mhc-bf16",), "FAIL", "fail", "warn", 2.54e-4, 0.153),
             step(4, ("mma-decode",), "PASS", "pass", "warn", 8.31e-5, 0.206))
    return view("several", ["hash-topk-scaling", "mhc-bf16"], steps,
                top=(("unexplained", 0.9988), ("{hash-topk-scaling}", 0.001)))


def test_a_drift_trial_is_a_warn_counted_as_fail_and_its_line_exits_so(several) -> None:
    fault = several.steps[2]
    assert run_word(fault) == "WARN"  # what `run` prints for it: drift alone never FAILs
    assert counted_text(several, fault) == "fail (its drift is like the bad end's)"
    pasted = reproduce(several, fault)
    assert pasted.endswith("--only hash-topk-scaling --warn-as fail  # WARN, counted as fail: "
                           "exits 1")
    bad_end = several.steps[1]  # a whole `run` judged it: the trial policy counted its WARN
    assert counted_text(several, bad_end).startswith("fail (a WARN counts as fail: --warn-as "
                                                     "auto, the bad end only drifts")
    md = render_markdown(several)
    rows = [r for r in md.splitlines() if r.startswith("| 2 |")]
    assert "| WARN | fail (its drift is like the bad end's) |" in rows[0]
    assert "| FAIL |" not in md  # no trial says FAIL beside its drift WARN


def test_what_decided_is_said_and_several_culprits_are_ranked_by_drift(several) -> None:
    head = headline(several)
    assert head.startswith("several culprits, each failing on its own, ranked by their share "
                           "of the bad end's drift (mean KL over all positions): "
                           "hash-topk-scaling (variant double-scale) 96 % (93 % at answer "
                           "positions), mhc-bf16 21 % (98 % at answer positions)"), head
    md = render_markdown(several)
    assert md.startswith(f"# dsv4bisect bisect: several — {head}")
    assert "Bisected on drift relative to the two ends: the bad end loses no facts" in md
    assert "which is why `unexplained` leads" in md  # the table under the headline says why
    text = "\n".join(t for t, _ in terminal_lines(several))
    assert "bisected on drift relative to the two ends" in text
    assert "which is why `unexplained` leads" in text
    doc = report_json(several)
    assert doc["culprit_shares"]["hash-topk-scaling"] == pytest.approx(0.69 / 0.716)
    assert doc["culprit_shares"]["mhc-bf16"] == pytest.approx(0.153 / 0.716)


def test_the_terminal_prints_every_reproduce_line_and_each_culprit_alone(several) -> None:
    text = [t for t, _ in terminal_lines(several)]
    for s in several.steps:
        assert f"  step {s.step}: {reproduce(several, s)}" in text
    alone = [t for t in text if t.startswith("the culprit alone: ")]
    assert alone == [f"the culprit alone: {x}" for x in culprit_lines(several)]
    assert "--only hash-topk-scaling --warn-as fail" in alone[0]  # the larger share first
    assert "--only mhc-bf16 --warn-as fail" in alone[1]


def test_found_names_the_variant_that_differs() -> None:
    bad = {"mma-decode": "swa-ring-stale", "mhc-bf16": "bf16"}
    steps = (step(0, (), "PASS", "pass", "pass", 0.0, 0.0),)
    found = view("found", ["mma-decode"], steps, bad=bad, top=(("{mma-decode}", 0.98),))
    assert headline(found).startswith("culprit {mma-decode (variant swa-ring-stale)}")
    assert terminal_lines(found)[0][0].startswith("FOUND  culprit {mma-decode (variant "
                                                  "swa-ring-stale)}")
    plain = view("found", ["mhc-bf16"], steps, bad=bad, top=(("{mhc-bf16}", 0.98),))
    assert headline(plain).startswith("culprit {mhc-bf16} ")  # its default variant: no word


def test_posterior_png_numbers_steps_as_the_terminal_does(several) -> None:
    pytest.importorskip("matplotlib")
    fig = posterior_figure(several)
    ax = fig.axes[0]
    (unexplained, *_) = [ln for ln in ax.get_lines() if ln.get_label() == "unexplained"]
    assert list(unexplained.get_xdata()) == [-1, 0, 1, 2, 3, 4]  # the prior, then step N at N
    fig.canvas.draw()
    labels = {t.get_text() for t in ax.get_xticklabels()}
    assert "prior" in labels and "0" in labels
    assert "several" in ax.get_title() and "cannot hold several culprits" in ax.get_title()


def test_the_live_line_says_the_same_word_as_the_row() -> None:
    """The trial's line as it finishes: `run`'s word, and that the trial probe found it like
    the bad end (off a terminal: one plain line per trial)."""
    import io

    from rich.console import Console

    from dsv4bisect.bisect.events import TrialFinished
    from dsv4bisect.bisect.trials.runner import TrialResult
    from dsv4bisect.cli.bisect_display import BisectDisplay

    display = BisectDisplay()
    out = io.StringIO()
    display._con = Console(file=out, force_terminal=False, width=200)
    result = TrialResult("FAIL", signature="drift", duration_s=15.0,
                         details={"drift": {"status": "warn", "kl_mean": 1.8e-3}})
    display(TrialFinished(2, frozenset({"hash-topk-scaling"}), 0, 1, result))
    assert out.getvalue().strip() == "trial 2: WARN (drift like the bad end) in 15 s"


def test_every_trial_keeps_its_drift_in_every_view() -> None:
    """What the ranking compares: a full verdict's views and a sequential trial's figures both
    reach the ledger's details as {view: mean KL}."""
    from dsv4bisect.bisect.trials.engine_runner import view_kls
    from dsv4bisect.probe.sequential import DriftFigures

    full = {"status": "warn", "trigger": {"where": ANSWER, "kl_mean": 2.6e-4},
            "views": {ANSWER: {"status": "warn", "kl_mean": 2.6e-4, "top1_agreement": 1.0},
                      "all positions": {"status": "pass", "kl_mean": 1e-5,
                                        "top1_agreement": 1.0}}}
    assert view_kls(full) == {ANSWER: 2.6e-4, "all positions": 1e-5}
    figures = DriftFigures("warn", "positions 0-255", 3e-4, 1.0,
                           {"positions 0-255": (3e-4, 1.0), ANSWER: (1.48e-4, 1.0)})
    sequential = {"status": "warn", "trigger": figures.to_dict()}
    assert view_kls(sequential) == {"positions 0-255": 3e-4, ANSWER: 1.48e-4}
