"""`dsv4bisect bisect`: a request run end to end, as run/session.py runs `dsv4bisect run`.

cli/bisect.py parses the command line into one `BisectRequest` (bisect/setup.py) and calls
`bisect` with its front: what the command shows and measures on the way (the question, the
microtest priors, the plan, the live view of the trials). Here, in order: the question (one
profile's ends, two configurations, or an upgrade), `prepare` (the trial policy, the runner, the
noise, the costs, the spec), the plan, the preflight, the executor, the ledger (its lock first:
a second bisect on it is refused before it writes anything), the run directory, the driver and
the report; or `--resume` of a run directory, from the request its run file keeps
(`RunnerRequest`: the runner's, with its trial policy, the test command, the placement).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dsv4bisect.bisect.cluster.executors import executor_runner
from dsv4bisect.bisect.question import Question, resolve_question
from dsv4bisect.bisect.setup import BisectRequest, Prepared, prepare
from dsv4bisect.bisect.trials.node_runner import RunnerRequest, node_runner
from dsv4bisect.bisect.trials.runner import Runner
from dsv4bisect.bisect.trials.testcmd import TestCommandRunner
from dsv4bisect.config.resolve import Overrides
from dsv4bisect.engines.rundir import ensure_runs_root, new_run_dir
from dsv4bisect.errors import BisectError
from dsv4bisect.policy import Executor
from dsv4bisect.run.events import RunEvent
from dsv4bisect.run.orphans import clean_predecessors
from dsv4bisect.run.signals import interrupts

if TYPE_CHECKING:  # the search needs numpy: imported when a bisect runs, not with the CLI
    from dsv4bisect.bisect.driver import BisectOutcome
    from dsv4bisect.bisect.events import Event
    from dsv4bisect.bisect.plan.parallel_plan import NodePlan
    from dsv4bisect.bisect.plan.whole_plan import WholePlan
    from dsv4bisect.bisect.report import BisectView

# Simulated bisects per lever setting in --plan: 400, so that a plan with every run correct
# states P(correct) >= 0.99 (Wilson's 95 % lower bound: 0.9905; 200 gave 0.981), the figure a
# bisect is asked to hold; the plan line before a launch simulates fewer. The node plan's rows
# simulate as many (its rows of rounds of up to K proposals are each scored over 2^K outcome
# patterns: tens of seconds of CPU in all).
PLAN_RUNS, LINE_RUNS, NODE_PLAN_RUNS = 400, 30, 400


class Interrupted(KeyboardInterrupt):
    """Ctrl-C: every engine was stopped; the run directory resumes (`--resume`)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(str(run_dir))
        self.run_dir = run_dir


class Front(Protocol):
    """What the command line shows and measures while the session runs."""

    def show_question(self, prep: Prepared) -> None:
        """The candidates, what was left out and why, the noise."""

    def priors(self, prep: Prepared) -> dict[str, float]:
        """The prior weights with the microtest's multipliers (measured and shown there)."""

    def show_plan(self, prep: Prepared, plan: WholePlan, nodes: NodePlan | None) -> None:
        """The whole plan (`--plan`, with the node table on Ray), or its line before a launch."""

    def note(self, text: str, warn: bool = False) -> None: ...

    def live(self) -> AbstractContextManager[Callable[[Event], None]]:
        """The live view of the trials: the driver's events go to what it yields."""

    def run_event(self, event: RunEvent) -> None:
        """An engine's or a probe's progress inside a trial."""


def bisect(request: BisectRequest, front: Front) -> BisectView | None:
    """The bisect `request` asks, its report written (None: `--plan`, which launches and
    writes nothing)."""
    if request.resume is not None:
        return _resume(request.resume, front, request.preflight)
    question = ask(request)
    prep = prepare(question, request, front.run_event)
    front.show_question(prep)
    prep = prep.with_weights(front.priors(prep))
    full, policy, parallel = request.plan_only, prep.request.policy, prep.spec.parallel
    plan = prep.plan(trials=PLAN_RUNS if full else LINE_RUNS, compare=full)
    nodes = None
    if full and policy.executor is Executor.RAY:  # the same bisect on 1, 2, 4 and K nodes
        from dsv4bisect.bisect.plan.parallel_plan import node_counts, plan_nodes

        nodes = plan_nodes(prep.setup(), node_counts(prep.request.nodes or parallel),
                           trials=NODE_PLAN_RUNS, of=PLAN_RUNS)
    profile, ov = ((question.profile, Overrides(sets=question.sets))
                   if request.two_configurations else (request.profile, request.overrides))
    if not full and prep.engine is not None and request.preflight \
            and policy.executor is Executor.LOCAL:
        from dsv4bisect.engines.preflight import require  # on each node for Ray

        require(profile, ov)
    front.show_plan(prep, plan, nodes)
    return None if full else _start(prep, request, profile, front)


def ask(r: BisectRequest) -> Question:
    """The question: a profile's patches, two configurations, or an upgrade."""
    if not r.two_configurations:
        return resolve_question(r.profile, r.overrides, r.good, r.bad, r.candidates)
    if r.good is not None or r.bad is not None:
        raise BisectError("--good/--bad choose patch sets of one profile",
                          "drop them: --good-config/--bad-config and --upgrade-from set both "
                          "ends themselves")
    if r.upgrade_from is not None:
        if r.good_config is not None or r.bad_config is not None:
            raise BisectError("--upgrade-from and --good-config/--bad-config each set both "
                              "ends", "use one of them")
        from dsv4bisect.bisect.upgrade import upgrade_question

        return upgrade_question(r.profile, r.upgrade_from, r.overrides, r.candidates)
    if r.good_config is None or r.bad_config is None:
        raise BisectError("--good-config and --bad-config go together",
                          "give both: --good-config A --bad-config B")
    from dsv4bisect.bisect.config_question import config_question

    return config_question(r.good_config, r.bad_config, r.overrides, r.candidates)


def _start(prep: Prepared, request: BisectRequest, profile: str, front: Front) -> BisectView:
    from dsv4bisect.bisect.driver import start_bisect
    from dsv4bisect.bisect.ledger import Ledger

    ensure_runs_root(request.runs_root)
    stored, runner, spec = prep.request, prep.runner, prep.spec
    parallel = spec.parallel
    if prep.engine is not None:
        if stored.policy.shard:  # the ends' schedule the node plan prices lower (docs/cluster.md)
            from dsv4bisect.bisect.plan.parallel_plan import choose_ends
            from dsv4bisect.bisect.rounds import BESIDE, end_nodes

            asked = prep.question.bisect.ends  # the profile's bisect.ends, else the plan's
            stored = replace(stored, ends=asked if asked != "auto" else choose_ends(
                prep.setup(), stored.nodes or parallel, parallel, trials=NODE_PLAN_RUNS,
                of=PLAN_RUNS))
            # the search prices the ends on the nodes the executor lays them out on, and
            # fills the first round's other nodes where it runs trials beside them
            spec = replace(spec, end_nodes=end_nodes(stored.ends, parallel),
                           beside_ends=stored.ends == BESIDE)
        runner = executor_runner(prep.engine, stored, parallel, preflight=request.preflight)
    elif stored.policy.executor is not Executor.LOCAL:
        raise BisectError("--executor ray runs engine trials; a --test-cmd runs on this "
                          "machine", "drop --executor ray (or --test-cmd)")
    with Ledger.open(request.ledger) as ledger:
        _clean_predecessors(request.runs_root, front)
        run_dir = new_run_dir(request.runs_root, "bisect-" + Path(profile).stem,
                              runner.probe_hash)
        outcome = _drive(runner, run_dir, front, lambda emit: start_bisect(
            spec, runner, ledger, run_dir, emit, request=stored.to_json(),
            policy=stored.policy))
    return _report(outcome)


def _resume(run_dir: Path, front: Front, preflight: bool) -> BisectView:
    """Continue the bisect of `run_dir` with the runner its run file's request rebuilds: its
    test command, or the node runner of its trial policy (after the preflight a fresh bisect
    runs, on the recorded profile)."""
    from dsv4bisect.bisect.driver import read_run_file, resume_bisect
    from dsv4bisect.bisect.ledger import Ledger
    from dsv4bisect.bisect.spec import BisectSpec

    info = read_run_file(run_dir)
    doc = info.get("request") or {}
    if not doc.get("profile"):
        raise BisectError(f"`{run_dir}` was not started by `dsv4bisect bisect`",
                          "resume it from code with resume_bisect() and its runner")
    with Ledger.open(info["ledger"]) as ledger:
        spec = BisectSpec.from_json(ledger.get_run(info["run_id"]).settings)
        req = RunnerRequest.from_json({**doc, "good": dict(spec.good)})
        runner: Runner
        if req.test_cmd:
            runner = TestCommandRunner(req.test_cmd, cwd=req.test_cwd)
        else:
            if preflight and req.policy.executor is Executor.LOCAL:
                from dsv4bisect.engines.preflight import require

                require(req.profile, Overrides(sets=req.sets))
            runner = executor_runner(node_runner(req, front.run_event), req, spec.parallel,
                                     preflight=preflight)
        # Engines a kill -9 left: recorded by PID and start time in this runs root's run dirs
        # (this bisect's trials among them), stopped only if their launcher is gone.
        _clean_predecessors(run_dir.resolve().parent, front)
        front.note(f"resuming {run_dir}: finished trials come from the ledger")
        outcome = _drive(runner, run_dir, front,
                         lambda emit: resume_bisect(run_dir, runner, emit, ledger=ledger))
    return _report(outcome)


def _drive(runner: Runner, run_dir: Path, front: Front,
           go: Callable[[Callable[[Event], None]], BisectOutcome]) -> BisectOutcome:
    try:
        with interrupts(), front.live() as emit:
            try:
                return go(emit)
            finally:
                runner.close()  # hot engines kept up; Ray's actors
    except KeyboardInterrupt:
        runner.stop_all()  # trials in worker threads (--parallel) or on nodes
        raise Interrupted(run_dir) from None


def _report(outcome: BisectOutcome) -> BisectView:
    """The bisect's report, written into its run directory (report.md, report.json, plot)."""
    from dsv4bisect.bisect import report

    view = report.load_bisect(outcome.run_dir)
    report.write_report(view)
    return view


def _clean_predecessors(root: Path, front: Front) -> None:
    """Engines (and run records) a `kill -9`ed run or bisect left under this runs root."""
    for sentence in clean_predecessors(root):
        front.note(sentence, warn=True)
