"""`dsv4bisect bisect`: a request run end to end, as run/session.py runs `dsv4bisect run`.

cli/bisect.py parses the command line into one `BisectRequest` (bisect/setup.py) and calls
`bisect` with its front: what the command shows and measures on the way (the question, the
microtest priors, the plan, the live view of the trials). Here, in order: the question (one
profile's ends, two configurations, or an upgrade), `prepare` (the trial policy, the runner, the
noise, the costs, the spec), the plan, the preflight, the executor, the ledger (its lock first:
a second bisect on it is refused before it writes anything), the run directory, the driver and
the report; or `--resume` of a run directory, from the request its run file keeps
(`RunFileRequest`: the runner request with its trial policy, the test command and where it ran,
the placement, what was left out, the command line).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dsv4bisect.bisect.cluster.executors import Placement, executor_runner
from dsv4bisect.bisect.question import Question, resolve_question
from dsv4bisect.bisect.setup import BisectRequest, Prepared, prepare
from dsv4bisect.bisect.trials.node_runner import RunnerRequest, node_runner
from dsv4bisect.bisect.trials.runner import Runner
from dsv4bisect.bisect.trials.testcmd import TestCommandRunner
from dsv4bisect.config.resolve import Overrides
from dsv4bisect.engines.rundir import ensure_runs_root, new_run_dir
from dsv4bisect.errors import BisectError
from dsv4bisect.policy import Executor
from dsv4bisect.run.events import Notice, RunEvent
from dsv4bisect.run.orphans import clean_predecessors
from dsv4bisect.run.signals import interrupts

if TYPE_CHECKING:  # the search needs numpy: imported when a bisect runs, not with the CLI
    from dsv4bisect.bisect.driver import BisectOutcome
    from dsv4bisect.bisect.events import Event
    from dsv4bisect.bisect.plan.costs import PlanCosts
    from dsv4bisect.bisect.plan.parallel_plan import NodePlan
    from dsv4bisect.bisect.plan.whole_plan import WholePlan
    from dsv4bisect.bisect.report import BisectView
    from dsv4bisect.bisect.spec import BisectSpec

# Simulated bisects per lever setting in --plan: P(correct) to about ±1.5 pp (100 gave ±3 pp,
# enough to read 0.98 as 0.97 by chance); the plan line before a launch simulates fewer.
PLAN_RUNS = 200
LINE_RUNS = 30
# Simulated bisects per row of the node plan: fewer than the single-node plan's, so that 6-8
# rows of rounds of up to K proposals (each scored over 2^K outcome patterns) stay within a
# few seconds.
NODE_PLAN_RUNS = 100


@dataclass(frozen=True)
class Plan:
    """The simulated bisect: with `--plan` (`full`) every lever's saving and, on Ray, the node
    table (`nodes`); before a launch, its line."""

    whole: WholePlan
    costs: PlanCosts
    spec: BisectSpec
    nodes: NodePlan | None = None
    full: bool = False


@dataclass(frozen=True)
class Finished:
    outcome: BisectOutcome
    view: BisectView  # the report written into the run directory (bisect/report.py)
    question: Question | None = None  # None on a resume


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

    def show_plan(self, plan: Plan) -> None:
        """The whole plan (`plan.full`), or its line before a launch."""

    def note(self, text: str, warn: bool = False) -> None: ...

    def live(self) -> AbstractContextManager[Callable[[Event], None]]:
        """The live view of the trials: the driver's events go to what it yields."""

    def run_event(self, event: RunEvent) -> None:
        """An engine's or a probe's progress inside a trial."""


@dataclass(frozen=True)
class RunFileRequest:
    """What the run file keeps for a resume and a report (`bisect.json`'s `request`)."""

    runner: RunnerRequest  # with the trial policy
    placement: Placement = Placement()
    test_cmd: str | list[str] | None = None
    test_cwd: str | None = None  # where the test command runs (as at the start)
    left_out: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**self.runner.to_json(), **self.placement.to_json(), "test_cmd": self.test_cmd,
                "test_cwd": self.test_cwd, "left_out": [list(x) for x in self.left_out],
                "command": list(self.command)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], good: Mapping[str, str]) -> RunFileRequest:
        """`good`: the good end of the bisect's settings (the ledger's)."""
        return cls(RunnerRequest.from_json({**doc, "good": dict(good)}),
                   Placement.from_json(doc), doc.get("test_cmd"), doc.get("test_cwd"),
                   tuple((str(n), str(w)) for n, w in doc.get("left_out") or ()),
                   tuple(doc.get("command") or ()))


def bisect(request: BisectRequest, front: Front) -> Finished | None:
    """The bisect `request` asks (None: `--plan`, which launches and writes nothing)."""
    if request.resume is not None:
        return _resume(request.resume, front, request.preflight)
    question = ask(request)
    prep = prepare(question, request, front.run_event)
    front.show_question(prep)
    prep = prep.with_weights(front.priors(prep))
    plan = _plan(prep, request.plan_only)
    profile, ov = ((question.profile, Overrides(sets=question.sets))
                   if request.two_configurations else (request.profile, request.overrides))
    if not request.plan_only and request.test_cmd is None and request.preflight \
            and prep.policy.executor is Executor.LOCAL:
        from dsv4bisect.engines.preflight import require  # on each node for Ray

        require(profile, ov)
    front.show_plan(plan)
    if request.plan_only:
        return None
    return _start(prep, request, profile, front)


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


def _plan(prep: Prepared, full: bool) -> Plan:
    whole = prep.plan(trials=PLAN_RUNS if full else LINE_RUNS, compare=full)
    nodes = None
    if full and prep.policy.executor is Executor.RAY:  # the same bisect on 1, 2, 4 and K nodes
        from dsv4bisect.bisect.plan.parallel_plan import node_counts, plan_nodes

        nodes = plan_nodes(prep.setup(), node_counts(prep.placement.slots(prep.spec.parallel)),
                           trials=min(NODE_PLAN_RUNS, PLAN_RUNS), of=PLAN_RUNS)
    return Plan(whole, prep.costs, prep.spec, nodes, full)


def _start(prep: Prepared, request: BisectRequest, profile: str, front: Front) -> Finished:
    from dsv4bisect.bisect.driver import start_bisect
    from dsv4bisect.bisect.ledger import Ledger

    ensure_runs_root(request.runs_root)
    placement, runner = prep.placement, prep.runner
    if prep.engine is not None:
        if prep.policy.shard:  # the ends' schedule the node plan prices lower (docs/cluster.md)
            from dsv4bisect.bisect.plan.parallel_plan import choose_ends

            placement = replace(placement, ends=choose_ends(
                prep.setup(), placement.slots(prep.spec.parallel), prep.spec.parallel,
                trials=min(NODE_PLAN_RUNS, PLAN_RUNS), of=PLAN_RUNS))
        runner = executor_runner(prep.engine, prep.request, placement, prep.spec.parallel,
                                 preflight=request.preflight)
    elif prep.policy.executor is not Executor.LOCAL:
        raise BisectError("--executor ray runs engine trials; a --test-cmd runs on this "
                          "machine", "drop --executor ray (or --test-cmd)")
    stored = RunFileRequest(prep.request, placement, request.test_cmd,
                            os.getcwd() if request.test_cmd is not None else None,
                            prep.question.left_out, request.command)
    with Ledger.open(request.ledger) as ledger:
        _clean_predecessors(request.runs_root, front)
        run_dir = new_run_dir(request.runs_root, "bisect-" + Path(profile).stem,
                              runner.probe_hash)
        outcome = _drive(runner, run_dir, front, lambda emit: start_bisect(
            prep.spec, runner, ledger, run_dir, emit, request=stored.to_json(),
            policy=prep.policy))
    return _finished(outcome, prep.question)


def _resume(run_dir: Path, front: Front, preflight: bool) -> Finished:
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
        stored = RunFileRequest.from_json(doc, spec.good)
        runner = _resumed_runner(stored, spec.parallel, front, preflight)
        # Engines a kill -9 left: recorded by PID and start time in this runs root's run dirs
        # (this bisect's trials among them), stopped only if their launcher is gone.
        _clean_predecessors(run_dir.resolve().parent, front)
        front.note(f"resuming {run_dir}: finished trials come from the ledger")
        outcome = _drive(runner, run_dir, front,
                         lambda emit: resume_bisect(run_dir, runner, emit, ledger=ledger))
    return _finished(outcome, None)


def _resumed_runner(stored: RunFileRequest, parallel: int, front: Front,
                    preflight: bool) -> Runner:
    """The runner the run file's request rebuilds: its test command, or the node runner of
    its trial policy (after the preflight a fresh bisect runs, on the recorded profile)."""
    if stored.test_cmd:
        return TestCommandRunner(stored.test_cmd, cwd=stored.test_cwd)
    req = stored.runner
    if preflight and req.policy.executor is Executor.LOCAL:
        from dsv4bisect.engines.preflight import require

        require(req.profile, Overrides(sets=req.sets))
    return executor_runner(node_runner(req, front.run_event), req, stored.placement, parallel,
                           preflight=preflight)


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


def _finished(outcome: BisectOutcome, question: Question | None) -> Finished:
    from dsv4bisect.bisect import report

    view = report.load_bisect(outcome.run_dir)
    report.write_report(view)
    return Finished(outcome, view, question)


def _clean_predecessors(root: Path, front: Front) -> None:
    """Engines (and run records) a `kill -9`ed run or bisect left under this runs root."""
    for sentence in clean_predecessors(root):
        front.note(sentence, warn=True)
