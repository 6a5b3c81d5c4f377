"""`--plan --executor ray --parallel K`: the whole bisect on K nodes, as the Ray executor runs it
(pure; docs/cluster.md, "Reading the node plan").

The model (which node, rounds, shared ends, seed blocks, no confirmation, idle slots, the
common random numbers that make K = 1 without a confirmation the single-node plan's figure
exactly) is simulate.py's: the one simulated bisect, here on 1, 2, 4 and K nodes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from dsv4bisect.bisect.plan.simulate import (
    NodePool,
    NodeRun,
    Setup,
    available_levers,
    common_draws,
    pool_schedule,
    search_memo,
    simulate,
)
from dsv4bisect.bisect.rounds import ALONE, schedules
from dsv4bisect.errors import BisectError
from dsv4bisect.probe.stats import wilson

NODE_COUNTS = (1, 2, 4)  # the columns `--plan --executor ray` always shows


@dataclass(frozen=True)
class NodeFigures:
    """One node count and lever setting over every simulated bisect."""

    nodes: int
    levers: bool  # every lever the bisect has on, or none
    sharded: bool  # a trial's probe may be split across idle nodes (simulate.NodePool)
    round_size: int  # the search's proposals per round (--parallel; sharded: K, K/2 or 1)
    ends: str | None  # sharded: how the ends run (bisect/rounds.py: alone, together)
    mean_wall_s: float
    p90_wall_s: float
    mean_rounds: float
    mean_trials: float  # remedy included
    mean_launches: float  # on all nodes together
    mean_idle_slots: float  # node-rounds with no trial
    idle_share: float  # node time without work / node time (K × wall), over every run
    p_correct: float
    p_correct_low: float = 0.0  # Wilson's 95 % lower bound on it over the runs
    runs: int = 0  # simulated bisects behind the row

    def to_json(self) -> dict[str, float | int | bool]:  # wall_s: the mean, by its short name
        return {"nodes": self.nodes, "levers": self.levers, "sharded": self.sharded,
                "round_size": self.round_size, "ends": self.ends,
                "wall_s": self.mean_wall_s, "mean_wall_s": self.mean_wall_s,
                "p90_wall_s": self.p90_wall_s, "mean_rounds": self.mean_rounds,
                "mean_trials": self.mean_trials, "mean_launches": self.mean_launches,
                "mean_idle_slots": self.mean_idle_slots, "idle_share": self.idle_share,
                "p_correct": self.p_correct, "p_correct_low": self.p_correct_low,
                "runs": self.runs}


@dataclass(frozen=True)
class NodePlan:
    runs: int
    levers: tuple[str, ...]  # the levers this bisect has ("without" turns them all off)
    rows: tuple[NodeFigures, ...]  # per node count: with the levers, then without; each
    # unsharded, then sharded
    floor_s: tuple[tuple[int, float], ...] = ()  # per node count (floor_run), its schedule

    def row(self, nodes: int, levers: bool, sharded: bool = False) -> NodeFigures:
        return next(r for r in self.rows
                    if r.nodes == nodes and r.levers == levers and r.sharded == sharded)

    def floor(self, nodes: int) -> float:
        return dict(self.floor_s)[nodes]


def node_counts(asked: int) -> tuple[int, ...]:
    """1, 2 and 4 nodes, and the K asked for where it is another."""
    return tuple(sorted({*NODE_COUNTS, asked}))


def plan_nodes(setup: Setup, nodes: Sequence[int] = NODE_COUNTS, *, trials: int = 100,
               seed: int = 0, of: int | None = None) -> NodePlan:
    """Simulate `trials` whole bisects per node count, with every lever and without any, on the
    culprit sets and outcome streams of `whole_plan.plan_bisect(setup, trials=of, seed=seed)`
    (its first `trials`; `of` defaults to `trials`)."""
    if trials < 1:
        raise BisectError("the plan needs at least one simulated run", "use trials >= 1")
    if not nodes or min(nodes) < 1:
        raise BisectError(f"node counts {list(nodes)}", "use at least one node")
    setup = replace(setup, confirm=False)  # the Ray executor cannot launch fresh
    levers = available_levers(setup)
    culprits, seeds = common_draws(setup, max(of or trials, trials), seed)
    culprits, seeds = culprits[:trials], seeds[:trials]
    bare = setup.without(levers)
    rows = []
    for k in nodes:
        for on, cfg in ((True, setup), (False, bare)):
            priced = on or "priced" not in levers
            plain = _row(cfg, k, k, on, priced, False, culprits, seeds)
            rows.append(plain)
            if k == 1:  # one node has no other to share a probe with
                rows.append(replace(plain, sharded=True))
                continue
            rows.append(sharded_row(cfg, k, on, priced, culprits, seeds))
    chosen = {r.nodes: r.ends or ALONE for r in rows if r.levers and r.sharded}
    floors = tuple((k, float(np.mean([floor_run(setup, k, c, chosen[k]) for c in culprits])))
                   for k in nodes)
    return NodePlan(trials, levers, tuple(rows), floors)


def sharded_row(cfg: Setup, nodes: int, levers: bool, priced: bool,
                culprits: Sequence[frozenset[str]], seeds: Sequence[int]) -> NodeFigures:
    """The sharded row of `nodes` nodes: the ends alone, together or with trials beside them
    (bisect/rounds.py), then K trials a round, or K/2 or one (--nodes K --parallel N),
    whichever is priced lower."""
    return min((_row(cfg, nodes, size, levers, priced, True, culprits, seeds, ends)
                for size in sorted({nodes, (nodes + 1) // 2, 1}, reverse=True)
                for ends in schedules(size)), key=lambda r: r.mean_wall_s)


def choose_ends(setup: Setup, nodes: int, round_size: int, *, trials: int, of: int,
                seed: int = 0) -> str:
    """How a sharded bisect on `nodes` nodes, `round_size` proposals a round, runs its ends:
    the schedule (bisect/rounds.py) whose simulated whole bisect is shorter, on the culprit
    sets and outcome streams of the plan (`plan_nodes` with the same `trials`, `of`, `seed`),
    with every lever `setup` has on. The plan's sharded rows and the Ray executor's rounds
    (cli/bisect.py passes it to RayRunner) are this one choice."""
    setup = replace(setup, confirm=False)  # the Ray executor cannot launch fresh
    if nodes < 2:
        return ALONE  # one node: nothing to split
    culprits, seeds = common_draws(setup, max(of, trials), seed)
    culprits, seeds = culprits[:trials], seeds[:trials]
    priced = True
    return min((_row(setup, nodes, round_size, True, priced, True, culprits, seeds, ends)
                for ends in schedules(round_size)), key=lambda r: r.mean_wall_s).ends or ALONE


def floor_run(setup: Setup, nodes: int, culprits: frozenset[str], ends: str = ALONE) -> float:
    """What a bisect told the culprits must still run, with every lever, as the sharding
    executor runs it with the `ends` schedule (bisect/rounds.py): the two ends (one after the
    other, each sharded across every node; or together, each on its half), and one trial of
    the culprits (their failure, judged against the good end) on one node; no search, no
    re-test."""
    everything = frozenset(setup.candidates)
    pool = NodePool(setup.costs, everything, nodes, sharded=True, ends=ends)
    pair = [(frozenset(), False), (everything, True)]
    rounds = [pair] if ends != ALONE and nodes > 1 else [[end] for end in pair]
    wall = sum(pool.run_round(r).wall_s for r in rounds)
    if culprits != everything:
        wall += pool.run_round([(culprits, True)]).wall_s
    return wall


def _row(cfg: Setup, nodes: int, size: int, levers: bool, priced: bool, sharded: bool,
         culprits: Sequence[frozenset[str]], seeds: Sequence[int],
         ends: str = ALONE) -> NodeFigures:
    """One row: `size` proposals a round (the search's `parallel`) on `nodes` nodes; sharded,
    the ends run as `ends` says (bisect/rounds.py)."""
    schedule = pool_schedule(cfg.costs, sharded, ends)
    memo = search_memo(cfg, size, priced, schedule)
    runs = [simulate(cfg, nodes, c, random.Random(s), priced, memo, sharded, size, ends)
            for c, s in zip(culprits, seeds)]
    return _figures(nodes, levers, sharded, size, runs, schedule)


def _figures(nodes: int, levers: bool, sharded: bool, size: int,
             runs: list[NodeRun], ends: str | None = None) -> NodeFigures:
    wall = np.array([r.wall_s for r in runs])
    node_time = float(wall.sum()) * nodes
    idle = sum(rd.idle_s for r in runs for rd in r.rounds)
    return NodeFigures(
        nodes=nodes, levers=levers, sharded=sharded, round_size=size, ends=ends,
        mean_wall_s=float(wall.mean()), p90_wall_s=float(np.quantile(wall, 0.9)),
        mean_rounds=float(np.mean([len(r.rounds) for r in runs])),
        mean_trials=float(np.mean([r.trials for r in runs])),
        mean_launches=float(np.mean([r.launches for r in runs])),
        mean_idle_slots=float(np.mean([sum(rd.idle_slots for rd in r.rounds) for r in runs])),
        idle_share=idle / node_time if node_time > 0 else 0.0,
        p_correct=sum(r.correct for r in runs) / len(runs),
        p_correct_low=wilson(sum(r.correct for r in runs), len(runs))[0],
        runs=len(runs),
    )
