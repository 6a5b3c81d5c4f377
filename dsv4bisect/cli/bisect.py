"""`dsv4bisect bisect [PROFILE]`: find the patch, or interacting pair, that breaks the probe.

Parse → one `BisectRequest` → bisect/session.py → render, as `run` does: the session resolves
the question, prepares the bisect (the trial policy, the runner, the noise, the costs, the
spec), shows the plan, drives the search and writes report.md, report.json and posterior.png
into the run directory; what it shows on the way is cli/bisect_front.py's. Exit codes
(docs/bisect.md): 0 culprit found, 1 the ends do not differ or the search ends unexplained or
over budget, 5 bad input, 125 cannot test, 130 interrupted (resumable with --resume).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

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

if TYPE_CHECKING:
    from dsv4bisect.bisect.question import Question
    from dsv4bisect.bisect.session import Finished

EXIT = {"found": ExitCode.OK, "several": ExitCode.OK,  # culprits named: one set, or several
        "untestable": ExitCode.CANNOT_TEST}  # the rest: 1

Opt = typer.Option
# -- the options, declared once (their help is `dsv4bisect bisect --help`) ------------------
Profile = Annotated[str, typer.Argument(help="Profile (default: reference-all).")]
Tier = Annotated[str | None, Opt(help="Probe tier (default: the profile's).")]
Good = Annotated[str | None, Opt(metavar="P[:V],...|none", help="The good end's patches "
                                 "(default: all off except the required ones).")]
Bad = Annotated[str | None, Opt(metavar="P[:V],...|none", help="The bad end's patches "
                                "(default: the profile's, with the overrides).")]
Candidates = Annotated[str | None, Opt(metavar="P,Q", help="Search only these.")]
GoodConfig = Annotated[str | None, Opt(metavar="A", help="Bisect every difference between two "
                                       "configurations: A, the one that works (profile or run "
                                       "directory).")]
BadConfig = Annotated[str | None, Opt(metavar="B", help="...and B, the one that fails (the "
                                      "overrides apply to B).")]
UpgradeFrom = Annotated[str | None, Opt(metavar="RELEASE", help="Bisect an SGLang upgrade: the "
                                        "switches whose defaults changed since RELEASE (the "
                                        "profile's release is the new one).")]
Confidence = Annotated[float | None, Opt(callback=finite(0.5, 0.999999),
                                         help="Stop at this posterior (0.95).")]
MaxTrials = Annotated[int | None, Opt(min=2, max=100_000, help="Budget of probe runs.")]
Parallel = Annotated[int | None, Opt(min=1, max=64, help="Trials per round (K).")]
WarnAsOpt = Annotated[WarnAs | None, Opt(help="How a drift WARN counts: auto (default: like "
                                         "the bad end when the bad end only drifts, like the "
                                         "good end when it loses facts), fail or pass.")]
DriftOpt = Annotated[DriftRule | None, Opt(help="How a trial's drift is judged: by the run "
                                           "gate (absolute), or against the two ends "
                                           "(relative, the default where trials are hot: "
                                           "nearer the good end's is not a fail; "
                                           "docs/bisect.md).")]
TestCmd = Annotated[str | None, Opt(help="Judge with this shell command instead: exit 0 good, "
                                    "125 skip, 1-127 bad.")]
PlanOnly = Annotated[bool, Opt("--plan", help="Simulate and print the plan; launch nothing.")]
Resume = Annotated[Path | None, Opt(metavar="RUN_DIR", help="Continue a bisect.")]
Out = Annotated[Path, Opt("--out", metavar="RUNS_ROOT")]
LedgerOpt = Annotated[Path | None, Opt("--ledger", help="Default RUNS_ROOT/ledger.sqlite")]
FalseFail = Annotated[float | None, Opt(callback=finite(0, 0.99), help="Probe false-FAIL rate "
                                        "(default: measured in the ledger, else 0.05).")]
FalsePass = Annotated[float | None, Opt(callback=finite(0, 0.99),
                                        help="Probe false-PASS rate (likewise).")]
LaunchCost = Annotated[float | None, Opt(callback=finite(0, 1e7),
                                         help="Seconds per launch, for --plan.")]
SwitchCost = Annotated[float | None, Opt(callback=finite(0, 1e7),
                                         help="Seconds per hot switch, for --plan.")]
ProbeCost = Annotated[float | None, Opt(callback=finite(0, 1e7),
                                        help="Seconds per full probe, for --plan.")]
FreshLaunches = Annotated[bool, Opt("--fresh-launches", help="Launch every trial fresh and "
                                    "probe it at full size (no hot switching).")]
NoConfirm = Annotated[bool, Opt("--no-confirm", help="Skip the fresh-launch confirmation of a "
                                "culprit found with hot switching.")]
NoCache = Annotated[bool, Opt("--no-cache", help="Measure baselines and the microtest priors "
                              "again.")]
Nodes = Annotated[int | None, Opt(min=1, max=64, help="--executor ray: node slots (default: "
                                  "--parallel); beyond the round's trials, idle nodes shard "
                                  "their probes.")]
NoShard = Annotated[bool, Opt("--no-shard", help="--executor ray: never split a trial's probe "
                              "across idle nodes.")]
SkipPreflight = Annotated[bool, Opt("--skip-preflight", help="Launch without checking SGLang, "
                                    "the model, GPUs and ports first.")]
MicrotestPriors = Annotated[bool | None, Opt(
    "--microtest-priors/--no-microtest-priors", help="Prior weights from the microtest "
    "(default: on when the profile's checkpoint is readable here, off with --test-cmd).")]
ExecutorOpt = Annotated[Executor | None, Opt(help="Where trials run: this machine, or the "
                                             "nodes of a Ray cluster (docs/cluster.md; "
                                             "default: the profile's bisect.executor).")]
RayAddress = Annotated[str | None, Opt(metavar="ADDR", help="The Ray cluster's head "
                                       "(HOST:6379; default: bisect.ray_address, RAY_ADDRESS "
                                       "or the local one).")]


def register(app: typer.Typer) -> None:
    app.command("bisect")(bisect)


def bisect(profile: Profile = DEFAULT_PROFILE, tier: Tier = None, good: Good = None,
           bad: Bad = None, candidates: Candidates = None, good_config: GoodConfig = None,
           bad_config: BadConfig = None, upgrade_from: UpgradeFrom = None,
           confidence: Confidence = None, max_trials: MaxTrials = None,
           parallel: Parallel = None, warn_as: WarnAsOpt = None, drift: DriftOpt = None,
           test_cmd: TestCmd = None, plan_only: PlanOnly = False, resume: Resume = None,
           out: Out = Path("runs"), ledger_path: LedgerOpt = None,
           false_fail: FalseFail = None, false_pass: FalsePass = None,
           launch_cost: LaunchCost = None, switch_cost: SwitchCost = None,
           probe_cost: ProbeCost = None, fresh_launches: FreshLaunches = False,
           no_confirm: NoConfirm = False, no_cache: NoCache = False, nodes: Nodes = None,
           no_shard: NoShard = False, json_out: Json = False, fmt: FormatOpt = None,
           enable: Enable = None, disable: Disable = None, only: Only = None,
           sets: Set = None, skip_preflight: SkipPreflight = False,
           microtest_priors: MicrotestPriors = None, executor: ExecutorOpt = None,
           ray_address: RayAddress = None) -> None:
    """Find which patch (or interacting pair) makes the bad end fail where the good end passes.

    Exit codes: 0 culprit named at the confidence, 1 ends do not differ / unexplained / over
    budget, 5 bad input, 125 cannot test, 130 interrupted (prints the --resume command).
    """
    from dsv4bisect.bisect import session
    from dsv4bisect.bisect.setup import BisectRequest
    from dsv4bisect.cli.bisect_front import BisectFront

    one_output(json_out, fmt)
    request = BisectRequest(
        profile=profile, overrides=overrides(enable, disable, only, sets), good=good, bad=bad,
        candidates=candidates, good_config=good_config, bad_config=bad_config,
        upgrade_from=upgrade_from, tier=tier, confidence=confidence, max_trials=max_trials,
        parallel=parallel, warn_as=warn_as, drift=drift, test_cmd=test_cmd,
        false_fail=false_fail, false_pass=false_pass,
        costs={"launch": launch_cost, "switch": switch_cost, "probe": probe_cost},
        fresh_launches=fresh_launches, confirm=not no_confirm, use_cache=not no_cache,
        microtest_priors=microtest_priors, executor=executor, ray_address=ray_address,
        nodes=nodes, shard=not no_shard, plan_only=plan_only, preflight=not skip_preflight,
        resume=resume, runs_root=out, ledger_path=ledger_path,
        command=("dsv4bisect", *sys.argv[1:]))
    front = BisectFront(request, json_out)
    try:
        done = session.bisect(request, front)
    except session.Interrupted as stop:
        console().print(f"interrupted: finished trials are kept in the ledger; resume with\n"
                        f"  dsv4bisect bisect --resume {stop.run_dir}", style="yellow",
                        markup=False)
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    if done is None:  # --plan
        raise typer.Exit(0)
    _finish(done, json_out, fmt)


def _finish(done: Finished, json_out: bool, fmt: Format | None) -> None:
    """The summary on stderr, report.json or report.md on stdout, the exit code."""
    from dsv4bisect.bisect import report

    status = done.outcome.result.status.value
    if done.question is not None and done.question.upgrade and status == "good-end-fails":
        _say_code_regression(done.question)
    con = console()
    for text, style in report.terminal_lines(done.view):
        con.print(text, style=style, markup=False, highlight=False)
    if json_out:
        print((done.outcome.run_dir / "report.json").read_text(), end="")
    elif fmt is Format.md:
        stdout().file.write((done.outcome.run_dir / "report.md").read_text())
    raise typer.Exit(int(EXIT.get(status, ExitCode.FAIL)))


def _say_code_regression(q: Question) -> None:
    """An upgrade whose good end (the new release at the old defaults) fails already."""
    from dsv4bisect.bisect.upgrade import code_bisect_hint

    assert q.upgrade is not None
    old, new = q.upgrade
    console().print(f"the good end ({new} with {old}'s switch defaults) fails too: the "
                    f"regression is in {new}'s code, not in its switch defaults; "
                    + code_bisect_hint(q.profile, old, new), style="yellow", markup=False,
                    highlight=False)
