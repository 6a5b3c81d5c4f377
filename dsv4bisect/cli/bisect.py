"""`dsv4bisect bisect [PROFILE]`: find the patch, or interacting pair, that breaks the probe.

Parse → one `BisectRequest` → bisect/session.py → render, as `run` does: the session resolves
the question, prepares the bisect (the trial policy, the runner, the noise, the costs, the
spec), drives the search and writes report.md, report.json and posterior.png into the run
directory; `BisectFront` is what it shows on the way (the question, the microtest priors, the
plan, the live view). Exit codes (docs/bisect.md): 0 culprit found, 1 the ends do not differ or
the search ends unexplained or over budget, 5 bad input, 125 cannot test, 130 interrupted
(resumable with --resume).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dsv4bisect.cli.bisect_display import BisectDisplay
from dsv4bisect.cli.bisect_priors import bisect_priors, say_priors
from dsv4bisect.cli.options import (
    Disable,
    Enable,
    Format,
    FormatOpt,
    Json,
    Only,
    Set,
    finite,
    one_output,
    overrides,
)
from dsv4bisect.errors import ExitCode
from dsv4bisect.policy import DriftRule, Executor, WarnAs
from dsv4bisect.run.session import DEFAULT_PROFILE
from dsv4bisect.ui.console import console, stdout

if TYPE_CHECKING:  # the search needs numpy: imported when a bisect runs, not with the CLI
    from dsv4bisect.bisect.events import Event
    from dsv4bisect.bisect.plan.parallel_plan import NodePlan
    from dsv4bisect.bisect.plan.whole_plan import WholePlan
    from dsv4bisect.bisect.question import Question
    from dsv4bisect.bisect.report import BisectView
    from dsv4bisect.bisect.setup import BisectRequest, Prepared

EXIT = {"found": ExitCode.OK, "several": ExitCode.OK,  # culprits named: one set, or several
        "untestable": ExitCode.CANNOT_TEST}  # the rest: 1


def register(app: typer.Typer) -> None:
    app.command("bisect")(bisect)


Opt = typer.Option


def bisect(
    profile: Annotated[str, typer.Argument(help="Profile (default: reference-all).")
                       ] = DEFAULT_PROFILE,
    tier: Annotated[str | None, Opt(help="Probe tier (default: the profile's).")] = None,
    good: Annotated[str | None, Opt(metavar="P[:V],...|none", help="The good end's patches "
                                       "(default: all off except the required ones).")] = None,
    bad: Annotated[str | None, Opt(metavar="P[:V],...|none", help="The bad end's patches "
                                      "(default: the profile's, with the overrides).")] = None,
    candidates: Annotated[str | None, Opt(metavar="P,Q", help="Search only these.")] = None,
    good_config: Annotated[str | None, Opt(metavar="A", help="Bisect every difference "
                                           "between two configurations: A, the one that "
                                           "works (profile or run directory).")] = None,
    bad_config: Annotated[str | None, Opt(metavar="B", help="...and B, the one that fails "
                                          "(the overrides apply to B).")] = None,
    upgrade_from: Annotated[str | None, Opt(metavar="RELEASE", help="Bisect an SGLang "
                                            "upgrade: the switches whose defaults changed "
                                            "since RELEASE (the profile's release is the "
                                            "new one).")] = None,
    confidence: Annotated[float | None, Opt(callback=finite(0.5, 0.999999),
                                            help="Stop at this posterior (0.95).")] = None,
    max_trials: Annotated[int | None, Opt(min=2, max=100_000, help="Budget of probe runs.")
                          ] = None,
    parallel: Annotated[int | None, Opt(min=1, max=64, help="Trials per round (K).")] = None,
    warn_as: Annotated[WarnAs | None, Opt(help="How a drift WARN counts: auto (default: like "
                                           "the bad end when the bad end only drifts, like "
                                           "the good end when it loses facts), fail or pass.")
                        ] = None,
    drift: Annotated[DriftRule | None, Opt(help="How a trial's drift is judged: by the run "
                                           "gate (absolute), or against the two ends (relative, "
                                           "the default where trials are hot: nearer the good "
                                           "end's is not a fail; docs/bisect.md).")] = None,
    test_cmd: Annotated[str | None, Opt(help="Judge with this shell command instead: "
                                           "exit 0 good, 125 skip, 1-127 bad.")] = None,
    plan_only: Annotated[bool, Opt("--plan", help="Simulate and print the plan; launch "
                                   "nothing.")] = False,
    resume: Annotated[Path | None, Opt(metavar="RUN_DIR", help="Continue a bisect.")] = None,
    out: Annotated[Path, Opt("--out", metavar="RUNS_ROOT")] = Path("runs"),
    ledger_path: Annotated[Path | None, Opt("--ledger", help="Default RUNS_ROOT/ledger.sqlite"
                                               )] = None,
    false_fail: Annotated[float | None, Opt(callback=finite(0, 0.99), help="Probe false-FAIL "
                                               "rate (default: measured in the ledger, else "
                                               "0.05).")] = None,
    false_pass: Annotated[float | None, Opt(callback=finite(0, 0.99),
                                            help="Probe false-PASS rate (likewise).")] = None,
    launch_cost: Annotated[float | None, Opt(callback=finite(0, 1e7),
                                             help="Seconds per launch, for --plan.")] = None,
    switch_cost: Annotated[float | None, Opt(callback=finite(0, 1e7),
                                             help="Seconds per hot switch, for --plan.")] = None,
    probe_cost: Annotated[float | None, Opt(callback=finite(0, 1e7),
                                            help="Seconds per full probe, for --plan.")] = None,
    fresh_launches: Annotated[bool, Opt("--fresh-launches", help="Launch every trial fresh "
                                        "and probe it at full size (no hot switching).")
                              ] = False,
    full_ends: Annotated[bool, Opt("--full-ends", help="Probe the ends at the full tier at "
                               "once, not in two looks that stop when the bad end's loss is "
                               "established (docs/bisect.md).")] = False,
    no_confirm: Annotated[bool, Opt("--no-confirm", help="Skip the fresh-launch confirmation "
                                    "of a culprit found with hot switching.")] = False,
    no_cache: Annotated[bool, Opt("--no-cache", help="Measure baselines and the microtest "
                                  "priors again.")] = False,
    nodes: Annotated[int | None, Opt(min=1, max=64, help="--executor ray: node slots "
                                     "(default: --parallel); beyond the round's trials, idle "
                                     "nodes shard their probes.")] = None,
    no_shard: Annotated[bool, Opt("--no-shard", help="--executor ray: never split a trial's "
                                  "probe across idle nodes.")] = False,
    json_out: Json = False,
    fmt: FormatOpt = None,
    enable: Enable = None, disable: Disable = None, only: Only = None, sets: Set = None,
    skip_preflight: Annotated[bool, Opt("--skip-preflight", help="Launch without checking "
                                        "SGLang, the model, GPUs and ports first.")] = False,
    microtest_priors: Annotated[bool | None, Opt(
        "--microtest-priors/--no-microtest-priors", help="Prior weights from the microtest "
        "(default: on when the profile's checkpoint is readable here, off with --test-cmd).")
    ] = None,
    executor: Annotated[Executor | None, Opt(help="Where trials run: this machine, or the "
                                             "nodes of a Ray cluster (docs/cluster.md; "
                                             "default: the profile's bisect.executor).")
                        ] = None,
    ray_address: Annotated[str | None, Opt(metavar="ADDR", help="The Ray cluster's head "
                                           "(HOST:6379; default: bisect.ray_address, "
                                           "RAY_ADDRESS or the local one).")] = None,
) -> None:
    """Find which patch (or interacting pair) makes the bad end fail where the good end passes.

    Exit codes: 0 culprit named at the confidence, 1 ends do not differ / unexplained / over
    budget, 5 bad input, 125 cannot test, 130 interrupted (prints the --resume command).
    """
    from dsv4bisect.bisect import session
    from dsv4bisect.bisect.setup import BisectRequest

    one_output(json_out, fmt)
    request = BisectRequest(
        profile=profile, overrides=overrides(enable, disable, only, sets), good=good, bad=bad,
        candidates=candidates, good_config=good_config, bad_config=bad_config,
        upgrade_from=upgrade_from, tier=tier, confidence=confidence, max_trials=max_trials,
        parallel=parallel, warn_as=warn_as, drift=drift, test_cmd=test_cmd,
        false_fail=false_fail, false_pass=false_pass,
        costs={"launch": launch_cost, "switch": switch_cost, "probe": probe_cost},
        fresh_launches=fresh_launches, full_ends=True if full_ends else None,
        confirm=not no_confirm, use_cache=not no_cache,
        microtest_priors=microtest_priors, executor=executor, ray_address=ray_address,
        nodes=nodes, shard=not no_shard, plan_only=plan_only, preflight=not skip_preflight,
        resume=resume, runs_root=out, ledger_path=ledger_path,
        command=("dsv4bisect", *sys.argv[1:]))
    front = BisectFront(request, json_out)
    try:
        view = session.bisect(request, front)
    except session.Interrupted as stop:
        console().print(f"interrupted: finished trials are kept in the ledger; resume with\n"
                        f"  dsv4bisect bisect --resume {stop.run_dir}", style="yellow",
                        markup=False)
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    if view is None:  # --plan
        raise typer.Exit(0)
    _finish(view, front.question, json_out, fmt)


def _finish(view: BisectView, question: Question | None, json_out: bool,
            fmt: Format | None) -> None:
    """The summary on stderr, report.json or report.md on stdout, the exit code."""
    from dsv4bisect.bisect import report

    status = view.result["status"]
    if question is not None and question.upgrade and status == "good-end-fails":
        _say_code_regression(question)
    con = console()
    for text, style in report.terminal_lines(view):
        con.print(text, style=style, markup=False, highlight=False)
    localise = localise_line(view) if status in ("found", "several") else None
    if localise is not None:
        con.print(f"which op: {localise}", style="bold", markup=False, highlight=False)
    if json_out:
        print((view.run_dir / "report.json").read_text(), end="")
    elif fmt is Format.md:
        stdout().file.write((view.run_dir / "report.md").read_text())
    raise typer.Exit(int(EXIT.get(status, ExitCode.FAIL)))


def localise_line(view: BisectView) -> str | None:
    """The `dsv4bisect localise` command for this bisect's culprit, printed after it: the one
    place the bisect asks for it (bisect/localise_input.py `localise_command`: None where
    `localise` cannot take this bisect)."""
    from dsv4bisect.bisect.localise_input import localise_command

    return localise_command(view.run_dir)


def _say_code_regression(q: Question) -> None:
    """An upgrade whose good end (the new release at the old defaults) fails already."""
    from dsv4bisect.bisect.upgrade import code_bisect_hint

    assert q.upgrade is not None
    old, new = q.upgrade
    console().print(f"the good end ({new} with {old}'s switch defaults) fails too: the "
                    f"regression is in {new}'s code, not in its switch defaults; "
                    + code_bisect_hint(q.profile, old, new), style="yellow", markup=False,
                    highlight=False)


class BisectFront(BisectDisplay):
    """The session's front on the terminal (bisect/session.py `Front`): the live view of the
    trials (BisectDisplay), Rich on stderr, the plan on stdout with `--plan --json`.
    `question`: the one it showed (None on a resume)."""

    def __init__(self, request: BisectRequest, json_out: bool) -> None:
        super().__init__()
        self.request, self.json_out = request, json_out
        self.question: Question | None = None

    def show_question(self, prep: Prepared) -> None:
        self.question = prep.question
        say_question(prep.question, prep.noise.false_fail, prep.noise.false_pass,
                     prep.noise_source)
        if prep.ends_note is not None:
            console().print(f"ends: {prep.ends_note}", style="dim", markup=False,
                            highlight=False)

    def priors(self, prep: Prepared) -> dict[str, float]:
        r = self.request
        measured = bisect_priors(prep.question, r.microtest_priors,
                                 test_cmd=r.test_cmd is not None, tier=r.tier,
                                 use_cache=r.use_cache)
        weights = measured.apply(prep.spec.weights)
        say_priors(measured, weights)
        return weights

    def show_plan(self, prep: Prepared, plan: WholePlan, nodes: NodePlan | None) -> None:
        if not self.request.plan_only:
            console().print(plan_line(plan, prep.spec.candidates), markup=False,
                            highlight=False)
        elif self.json_out:
            print(json.dumps(plan_json(prep, plan, nodes), indent=2))
        else:
            console().print("\n".join(plan_text(prep, plan, nodes)), markup=False,
                            highlight=False)

    def note(self, text: str, warn: bool = False) -> None:
        console().print(text, style="yellow" if warn else "dim", markup=False,
                        highlight=False)

    def live(self) -> AbstractContextManager[Callable[[Event], None]]:
        return self


LEVER_NAMES = {"hot": "hot switching", "sequential": "sequential trial probe",
               "priors": "microtest priors", "priced": "priced design"}


def plan_line(p: WholePlan, candidates: tuple[str, ...]) -> str:
    f = p.with_levers
    line = (f"plan: {len(candidates)} candidates, expected wall ≈ {dur(f.mean_wall_s)} "
            f"(p90 {dur(f.p90_wall_s)}), expected launches {f.mean_launches:.1f}, trials "
            f"{f.mean_trials:.1f}, P(correct) {f.p_correct:.2f}")
    if p.without_levers is not None:
        line += f"; without the levers ≈ {dur(p.without_levers.mean_wall_s)}"
    return line


def _figures(f: Any) -> dict[str, Any]:
    return {"mean_wall_s": f.mean_wall_s, "p90_wall_s": f.p90_wall_s,
            "mean_trials": f.mean_trials, "mean_launches": f.mean_launches,
            "p_correct": f.p_correct, "p_correct_low": f.p_correct_low,
            "phase_s": dict(f.phase_s)}


def plan_json(prep: Prepared, p: WholePlan, nodes: NodePlan | None) -> dict[str, Any]:
    """`--plan --json`: the figures with every lever, without each, without any; the costs
    with their sources; on Ray, the node table."""
    from dsv4bisect.bisect.plan.whole_plan import LEVERS
    from dsv4bisect.cli.bisect_nodes import node_json

    costs, spec = prep.costs, prep.spec
    levers = {name: ({"available": True, "saves_s": p.saves_s(name),
                      "off": _figures(p.each_off[name])} if name in p.levers
                     else {"available": False, "saves_s": 0.0}) for name in LEVERS}
    f = p.with_levers
    extra = {} if nodes is None else {
        "nodes": node_json(nodes, spec.parallel, [c.to_json() for c in costs.lines])}
    return {
        "n_candidates": len(spec.candidates), "candidates": list(spec.candidates),
        "runs": p.runs,
        "noise": {"false_fail": spec.noise.false_fail, "false_pass": spec.noise.false_pass},
        "trial_noise": {"false_fail": costs.trial_noise.false_fail,
                        "false_pass": costs.trial_noise.false_pass},
        "mean_launches": f.mean_launches, "mean_trials": f.mean_trials,
        "mean_wall_s": f.mean_wall_s, "p90_wall_s": f.p90_wall_s,
        "p_correct": f.p_correct, "p_correct_low": f.p_correct_low,
        "phase_s": dict(f.phase_s),
        "with_levers": _figures(f),
        "without_levers": _figures(p.without_levers) if p.without_levers else None,
        "levers": levers, "costs": [line.to_json() for line in costs.lines],
        "load_time": sorted(costs.costs.load_time), "hot": costs.costs.hot,
        "confirm": spec.confirm, "ends_looks": costs.costs.looks,
        **({"ends_note": prep.ends_note} if prep.ends_note else {}), **extra}


def plan_text(prep: Prepared, p: WholePlan, nodes: NodePlan | None) -> list[str]:
    """`--plan` on stderr: the plan line, every cost with its source, where the time goes,
    what each lever saves, the figure without any; on Ray, the node table."""
    from dsv4bisect.bisect.plan.whole_plan import LEVERS
    from dsv4bisect.cli.bisect_nodes import node_lines

    costs, spec = prep.costs, prep.spec
    out = [plan_line(p, spec.candidates), "costs:"]
    for line in costs.lines:
        value = (f"{line.value:.0f} s" if line.unit == "s" else f"{line.value:.2f} of the "
                 "full probe" if line.unit == "share" else f"{line.value:.0f}")
        out.append(f"  {line.name}: {value} — {line.source}")
    if costs.costs.load_time:
        out.append(f"  need a fresh launch (load time): {', '.join(sorted(costs.costs.load_time))}")
    f = p.with_levers
    out.append("where the time goes (with the levers): " + ", ".join(
        f"{name} {dur(s)}" for name, s in f.phase_s.items()))
    out.append(f"levers (each off in turn; the same {p.runs} simulated culprit sets, drawn "
               "from a flat prior, and outcomes):")
    for name in LEVERS:
        if name in p.levers:
            off = p.each_off[name]
            out.append(f"  {LEVER_NAMES[name]}: saves {dur(max(p.saves_s(name), 0))} "
                       f"(off: {dur(off.mean_wall_s)}, P(correct) {off.p_correct:.2f})")
        else:
            out.append(f"  {LEVER_NAMES[name]}: off here")
    if p.without_levers is not None:
        w = p.without_levers
        out.append(f"without any lever (fresh launches, full probes, no microtest priors, "
                   f"unpriced design; everything counted): {dur(w.mean_wall_s)} (p90 "
                   f"{dur(w.p90_wall_s)}), {w.mean_launches:.1f} launches, P(correct) "
                   f"{w.p_correct:.2f}")
    if nodes is not None:
        out += node_lines(nodes, spec.parallel, p.runs, dur)
    out.append(f"(simulated {p.runs} bisects per configuration; nothing was launched)")
    return out


def say_question(q: Question, false_fail: float, false_pass: float, where: str) -> None:
    con = console()
    con.print(f"candidates ({len(q.candidates)}): {', '.join(q.candidates)}", markup=False)
    for name in q.candidates:
        how = q.deliveries.get(name, "reference")
        if how != "reference" or name in q.tier_names:
            extra = [how] if how != "reference" else []
            extra += [f"tier {q.tier_names[name]}"] if name in q.tier_names else []
            extra += ["load-time" if name in q.load_time else "hot"]
            con.print(f"  {name}: {'; '.join(extra)}", markup=False, highlight=False)
    for name, why in q.left_out:
        con.print(f"left out: {name} ({why})", style="dim", markup=False)
    if q.upgrade is not None:
        from dsv4bisect.bisect.upgrade import code_bisect_hint

        old, new = q.upgrade
        con.print(f"upgrade {old} → {new}: good end = {new} with {old}'s switch defaults. If "
                  f"it fails too, the regression is in code: "
                  + code_bisect_hint(q.profile, old, new), style="dim", markup=False,
                  highlight=False)
    con.print(f"noise: false fail {false_fail:.3g}, false pass {false_pass:.3g} "
              f"({where})", style="dim", markup=False)


def dur(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"
