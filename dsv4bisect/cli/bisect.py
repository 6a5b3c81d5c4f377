"""`dsv4bisect bisect [PROFILE]`: find the patch, or interacting pair, that breaks the probe.

Parse → prepare → drive → render: resolves the question (bisect/question.py: the ends, the
candidates less the inert ones), prepares the bisect (bisect/setup.py: the runner, the noise,
the costs, the spec, the plan), prints the plan line, drives the search (bisect/driver.py)
with the engine+probe runner or `--test-cmd`, shows the posterior live on stderr, and writes
report.md, report.json and posterior.png into the run directory. Exit codes (docs/bisect.md): 0 culprit found, 1 the
ends do not differ or the search ends unexplained or over budget, 5 bad input, 125 cannot
test, 130 interrupted (resumable with --resume).
"""

from __future__ import annotations

import json
import os
import sys
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dsv4bisect.bisect.cluster.executors import executor_runner
from dsv4bisect.bisect.question import Question, resolve_question
from dsv4bisect.bisect.trials.engine_runner import EngineRunner
from dsv4bisect.bisect.trials.node_runner import RunnerRequest, node_runner
from dsv4bisect.bisect.trials.runner import Runner
from dsv4bisect.bisect.trials.testcmd import TestCommandRunner
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
from dsv4bisect.config.resolve import Overrides
from dsv4bisect.engines.rundir import ensure_runs_root, new_run_dir
from dsv4bisect.errors import BisectError, ConfigError, ExitCode
from dsv4bisect.run.orphans import clean_predecessors
from dsv4bisect.run.session import DEFAULT_PROFILE
from dsv4bisect.run.signals import interrupts
from dsv4bisect.ui.console import console, stdout

if TYPE_CHECKING:  # the search needs numpy: imported when a bisect runs, not with the CLI
    from dsv4bisect.bisect.driver import BisectOutcome
    from dsv4bisect.bisect.plan.costs import PlanCosts
    from dsv4bisect.bisect.plan.parallel_plan import NodePlan
    from dsv4bisect.bisect.plan.whole_plan import WholePlan
    from dsv4bisect.bisect.search.design import Noise
    from dsv4bisect.bisect.spec import BisectSpec

LEDGER = "ledger.sqlite"  # in RUNS_ROOT unless --ledger: shared, so no bisect repeats a trial
EXIT = {"found": ExitCode.OK, "several": ExitCode.OK,  # culprits named: one set, or several
        "untestable": ExitCode.CANNOT_TEST}  # the rest: 1
# Simulated bisects per lever setting in --plan: P(correct) to about ±1.5 pp (100 gave ±3 pp,
# enough to read 0.98 as 0.97 by chance).
PLAN_RUNS = 200


class WarnAs(str, Enum):
    auto = "auto"
    fail = "fail"
    passed = "pass"


class DriftRule(str, Enum):
    absolute = "absolute"
    relative = "relative"


class Executor(str, Enum):
    local = "local"
    ray = "ray"


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
    warn_as: Annotated[WarnAs | None, Opt(help="How a drift WARN counts: auto (default: like the bad end when the bad end "
                 "only drifts, like the good end when it loses facts), fail or pass.")] = None,
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
    no_confirm: Annotated[bool, Opt("--no-confirm", help="Skip the fresh-launch confirmation "
                                    "of a culprit found with hot switching.")] = False,
    no_cache: Annotated[bool, Opt("--no-cache", help="Measure baselines and the microtest priors again.")] = False,
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
    from dsv4bisect.bisect.driver import start_bisect
    from dsv4bisect.bisect.ledger import Ledger

    one_output(json_out, fmt)
    display = BisectDisplay()
    if resume is not None:
        outcome = _resume(resume, display, preflight=not skip_preflight)
    else:
        from dsv4bisect.bisect.setup import Asked, prepare

        ov = overrides(enable, disable, only, sets)
        question = _question(profile, ov, good, bad, candidates, good_config, bad_config,
                             upgrade_from)
        if good_config or bad_config or upgrade_from:  # trials run the good end's profile
            profile, ov = question.profile, Overrides(sets=question.sets)
        prep = prepare(question, Asked(
            ledger_path or out / LEDGER, tier, confidence, max_trials, parallel,
            warn_as.value if warn_as else None, drift.value if drift else None, test_cmd,
            false_fail, false_pass,
            {"launch": launch_cost, "switch": switch_cost, "probe": probe_cost},
            fresh_launches, not no_confirm, not no_cache,
            executor.value if executor else None, ray_address), display.run_event)
        _say_question(question, prep.noise, prep.noise_source)
        mt_priors = bisect_priors(question, microtest_priors, test_cmd=test_cmd is not None,
                                  tier=tier, use_cache=not no_cache)
        prep = prep.with_weights(mt_priors.apply(prep.spec.weights))
        spec, placement = prep.spec, {**prep.placement, "shard": not no_shard,
                                      "nodes": _node_slots(nodes, prep.spec.parallel,
                                                           prep.placement)}
        say_priors(mt_priors, spec.weights)
        estimate = prep.plan(trials=PLAN_RUNS if plan_only else 30, compare=plan_only)
        if plan_only:
            nodes = None
            if placement["executor"] == "ray":  # the same bisect on 1, 2, 4 and K nodes
                from dsv4bisect.cli.bisect_nodes import node_plan

                nodes = node_plan(prep.setup(), placement["nodes"] or spec.parallel, PLAN_RUNS)
            _show_plan(estimate, prep.costs, spec, json_out, nodes)
            raise typer.Exit(0)
        if test_cmd is None and not skip_preflight and placement["executor"] == "local":
            from dsv4bisect.engines.preflight import require  # on each node for Ray

            require(profile, ov)
        console().print(_plan_line(estimate, spec), markup=False, highlight=False)
        ensure_runs_root(out)
        runner, req = prep.runner, prep.request
        if placement["executor"] == "ray" and placement["shard"] and prep.engine is not None:
            # the ends' schedule the node plan prices lower for these nodes and costs, kept in
            # the run's request for a resume (docs/cluster.md, "Sharded rows")
            from dsv4bisect.cli.bisect_nodes import ends_choice

            placement["ends"] = ends_choice(prep.setup(), placement["nodes"] or spec.parallel,
                                            spec.parallel, PLAN_RUNS)
        if prep.engine is not None:
            runner = _executor(prep.engine, req, placement, spec.parallel, not skip_preflight)
        elif placement["executor"] != "local":
            raise BisectError("--executor ray runs engine trials; a --test-cmd runs on this "
                              "machine", "drop --executor ray (or --test-cmd)")
        request = {**req.to_json(), "profile": profile, "test_cmd": test_cmd,
                   "test_cwd": os.getcwd() if test_cmd is not None else None,
                   "left_out": [list(x) for x in question.left_out],
                   "command": ["dsv4bisect", *sys.argv[1:]], **placement}
        # The ledger's lock first: a second bisect on it is refused before it writes anything.
        with Ledger.open(ledger_path or out / LEDGER) as ledger:
            _clean_predecessors(out)
            run_dir = new_run_dir(out, "bisect-" + Path(profile).stem, runner.probe_hash)
            outcome = _drive(runner, run_dir, display, lambda: start_bisect(
                spec, runner, ledger, run_dir, display, request=request))
        if question.upgrade and outcome.result.status.value == "good-end-fails":
            _say_code_regression(question)
    _finish(outcome, json_out, fmt)


def _say_code_regression(q: Question) -> None:
    """An upgrade whose good end (the new release at the old defaults) fails already."""
    from dsv4bisect.bisect.upgrade import code_bisect_hint

    assert q.upgrade is not None
    old, new = q.upgrade
    console().print(f"the good end ({new} with {old}'s switch defaults) fails too: the "
                    f"regression is in {new}'s code, not in its switch defaults; "
                    + code_bisect_hint(q.profile, old, new), style="yellow", markup=False,
                    highlight=False)


def _question(profile: str, ov: Overrides, good: str | None, bad: str | None,
              candidates: str | None, good_config: str | None, bad_config: str | None,
              upgrade_from: str | None) -> Question:
    """The question: a profile's patches, two configurations, or an upgrade."""
    if good_config is None and bad_config is None and upgrade_from is None:
        return resolve_question(profile, ov, good, bad, candidates)
    if good is not None or bad is not None:
        raise BisectError("--good/--bad choose patch sets of one profile",
                          "drop them: --good-config/--bad-config and --upgrade-from set both "
                          "ends themselves")
    if upgrade_from is not None:
        if good_config is not None or bad_config is not None:
            raise BisectError("--upgrade-from and --good-config/--bad-config each set both "
                              "ends", "use one of them")
        from dsv4bisect.bisect.upgrade import upgrade_question

        return upgrade_question(profile, upgrade_from, ov, candidates)
    if good_config is None or bad_config is None:
        raise BisectError("--good-config and --bad-config go together",
                          "give both: --good-config A --bad-config B")
    from dsv4bisect.bisect.config_question import config_question

    return config_question(good_config, bad_config, ov, candidates)


def _drive(runner: Runner, run_dir: Path, display: BisectDisplay, go: Any) -> BisectOutcome:
    try:
        with interrupts(), display:
            try:
                return go()  # type: ignore[no-any-return]
            finally:
                runner.close()  # hot engines kept up; Ray's actors
    except KeyboardInterrupt:
        runner.stop_all()  # trials in worker threads (--parallel) or on nodes
        console().print(f"interrupted: finished trials are kept in the ledger; resume with\n"
                        f"  dsv4bisect bisect --resume {run_dir}", style="yellow",
                        markup=False)
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None


def _resume(run_dir: Path, display: BisectDisplay, preflight: bool = True) -> BisectOutcome:
    from dsv4bisect.bisect.driver import read_run_file, resume_bisect
    from dsv4bisect.bisect.ledger import Ledger
    from dsv4bisect.bisect.spec import BisectSpec

    info = read_run_file(run_dir)
    request = info.get("request")
    if not request:
        raise BisectError(f"`{run_dir}` was not started by `dsv4bisect bisect`",
                          "resume it from code with resume_bisect() and its runner")
    with Ledger.open(info["ledger"]) as ledger:
        spec = BisectSpec.from_json(ledger.get_run(info["run_id"]).settings)
        runner: Runner
        if request.get("test_cmd"):
            cwd = request.get("test_cwd")
            runner = TestCommandRunner(request["test_cmd"],
                                       cwd=cwd if isinstance(cwd, str) else None)
        else:
            local = request.get("executor", "local") == "local"
            if preflight and local:  # the same check as a fresh bisect's, recorded profile
                from dsv4bisect.config.resolve import Overrides
                from dsv4bisect.engines.preflight import require

                require(request["profile"], Overrides(sets=tuple(request.get("sets") or ())))
            req = RunnerRequest.from_json({**request, "good": spec.good})
            runner = _executor(node_runner(req, display.run_event), req, request,
                               spec.parallel, preflight)
        # Engines a kill -9 left: recorded by PID and start time in this runs root's run dirs
        # (this bisect's trials among them), stopped only if their launcher is gone.
        _clean_predecessors(run_dir.resolve().parent)
        console().print(f"resuming {run_dir}: finished trials come from the ledger",
                        style="dim", markup=False)
        return _drive(runner, run_dir, display,
                      lambda: resume_bisect(run_dir, runner, display, ledger=ledger))


def _clean_predecessors(root: Path) -> None:
    """Engines (and run records) a `kill -9`ed run or bisect left under this runs root."""
    for sentence in clean_predecessors(root):
        console().print(sentence, style="yellow", markup=False, highlight=False)



def _node_slots(nodes: int | None, parallel: int, placement: dict[str, Any]) -> int | None:
    """`--nodes`: the Ray executor's slots, at least the round's trials (`--parallel`)."""
    if nodes is None:
        return None
    if placement.get("executor") != "ray":
        raise ConfigError("--nodes is the Ray executor's", "add --executor ray, or drop --nodes")
    if nodes < parallel:
        raise ConfigError(f"--nodes {nodes} is fewer than --parallel {parallel} trials a round",
                          f"use --nodes {parallel} or more (the extra nodes shard probes)")
    return nodes


def _executor(runner: EngineRunner, request: RunnerRequest, placement: dict[str, Any],
              parallel: int, preflight: bool) -> Runner:
    """The local runner, or the executor's that sends its trials to a Ray cluster's nodes."""
    slots = int(placement.get("nodes") or parallel)
    return executor_runner(placement.get("executor") or "local", runner, request, slots,
                           address=placement.get("ray_address"),
                           node_resource=placement.get("node_resource"), preflight=preflight,
                           shard=bool(placement.get("shard", True)),
                           ends=placement.get("ends"))









def _plan_line(p: WholePlan, spec: BisectSpec) -> str:
    f = p.with_levers
    line = (f"plan: {len(spec.candidates)} candidates, expected wall ≈ {_dur(f.mean_wall_s)} "
            f"(p90 {_dur(f.p90_wall_s)}), expected launches {f.mean_launches:.1f}, trials "
            f"{f.mean_trials:.1f}, P(correct) {f.p_correct:.2f}")
    if p.without_levers is not None:
        line += f"; without the levers ≈ {_dur(p.without_levers.mean_wall_s)}"
    return line


LEVER_NAMES = {"hot": "hot switching", "sequential": "sequential trial probe",
               "priors": "microtest priors", "priced": "priced design"}


def _show_plan(p: WholePlan, costs: PlanCosts, spec: BisectSpec, json_out: bool,
               nodes: NodePlan | None = None) -> None:
    """The plan on stdout (`--json`) or stderr; `nodes`: the node table of `--executor ray`."""
    from dsv4bisect.bisect.plan.whole_plan import LEVERS
    from dsv4bisect.cli.bisect_nodes import node_json, node_lines

    def figures(f: Any) -> dict[str, Any]:
        return {"mean_wall_s": f.mean_wall_s, "p90_wall_s": f.p90_wall_s,
                "mean_trials": f.mean_trials, "mean_launches": f.mean_launches,
                "p_correct": f.p_correct, "phase_s": dict(f.phase_s)}

    levers = {name: ({"available": True, "saves_s": p.saves_s(name),
                      "off": figures(p.each_off[name])} if name in p.levers
                     else {"available": False, "saves_s": 0.0}) for name in LEVERS}
    if json_out:
        f = p.with_levers
        extra = {} if nodes is None else {
            "nodes": node_json(nodes, spec.parallel, [c.to_json() for c in costs.lines])}
        print(json.dumps({
            "n_candidates": len(spec.candidates), "candidates": list(spec.candidates),
            "runs": p.runs,
            "noise": {"false_fail": spec.noise.false_fail, "false_pass": spec.noise.false_pass},
            "trial_noise": {"false_fail": costs.trial_noise.false_fail,
                            "false_pass": costs.trial_noise.false_pass},
            "mean_launches": f.mean_launches, "mean_trials": f.mean_trials,
            "mean_wall_s": f.mean_wall_s, "p90_wall_s": f.p90_wall_s,
            "p_correct": f.p_correct, "phase_s": dict(f.phase_s),
            "with_levers": figures(f),
            "without_levers": figures(p.without_levers) if p.without_levers else None,
            "levers": levers, "costs": [line.to_json() for line in costs.lines],
            "load_time": sorted(costs.costs.load_time), "hot": costs.costs.hot,
            "confirm": spec.confirm, **extra}, indent=2))
        return
    con = console()
    out = [_plan_line(p, spec), "costs:"]
    for line in costs.lines:
        value = (f"{line.value:.0f} s" if line.unit == "s" else f"{line.value:.2f} of the "
                 "full probe" if line.unit == "share" else f"{line.value:.0f}")
        out.append(f"  {line.name}: {value} — {line.source}")
    if costs.costs.load_time:
        out.append(f"  need a fresh launch (load time): {', '.join(sorted(costs.costs.load_time))}")
    f = p.with_levers
    out.append("where the time goes (with the levers): " + ", ".join(
        f"{name} {_dur(s)}" for name, s in f.phase_s.items()))
    out.append(f"levers (each off in turn; the same {p.runs} simulated culprit sets, drawn "
               "from a flat prior, and outcomes):")
    for name in LEVERS:
        if name in p.levers:
            off = p.each_off[name]
            out.append(f"  {LEVER_NAMES[name]}: saves {_dur(max(p.saves_s(name), 0))} "
                       f"(off: {_dur(off.mean_wall_s)}, P(correct) {off.p_correct:.2f})")
        else:
            out.append(f"  {LEVER_NAMES[name]}: off here")
    if p.without_levers is not None:
        w = p.without_levers
        out.append(f"without any lever (fresh launches, full probes, no microtest priors, "
                   f"unpriced design; everything counted): {_dur(w.mean_wall_s)} (p90 "
                   f"{_dur(w.p90_wall_s)}), {w.mean_launches:.1f} launches, P(correct) "
                   f"{w.p_correct:.2f}")
    if nodes is not None:
        out += node_lines(nodes, spec.parallel, p.runs, _dur)
    out.append(f"(simulated {p.runs} bisects per configuration; nothing was launched)")
    con.print("\n".join(out), markup=False, highlight=False)


def _say_question(q: Question, noise: Noise, where: str) -> None:
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
    con.print(f"noise: false fail {noise.false_fail:.3g}, false pass {noise.false_pass:.3g} "
              f"({where})", style="dim", markup=False)


def _finish(outcome: BisectOutcome, json_out: bool, fmt: Format | None) -> None:
    from dsv4bisect.bisect import report as report

    view = report.load_bisect(outcome.run_dir)
    report.write_report(view)
    con = console()
    for text, style in report.terminal_lines(view):
        con.print(text, style=style, markup=False, highlight=False)
    if json_out:
        print((outcome.run_dir / "report.json").read_text(), end="")
    elif fmt is Format.md:
        stdout().file.write((outcome.run_dir / "report.md").read_text())
    raise typer.Exit(int(EXIT.get(outcome.result.status.value, ExitCode.FAIL)))


def _dur(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"
