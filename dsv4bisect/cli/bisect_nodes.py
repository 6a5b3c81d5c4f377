"""The node table of `bisect --plan --executor ray`: the whole bisect on 1, 2 and 4 nodes (and
the K of `--parallel` where it is another), with every lever and without any, from one
simulation (bisect/plan/parallel_plan.py; docs/cluster.md, "Reading the node plan")."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy and the search: imported when the plan runs, not with the CLI
    from dsv4bisect.bisect.plan.parallel_plan import NodePlan
    from dsv4bisect.bisect.plan.whole_plan import Setup

# Simulated bisects per row: fewer than the single-node plan's, so that 6-8 rows of rounds of
# up to K proposals (each scored over 2^K outcome patterns) stay within a few seconds.
NODE_PLAN_RUNS = 100


def node_plan(setup: Setup, asked: int, main_runs: int, runs: int = NODE_PLAN_RUNS) -> NodePlan:
    """The rows, on the first `runs` culprit sets and outcome streams of the single-node plan
    of `main_runs` bisects."""
    from dsv4bisect.bisect.plan.parallel_plan import node_counts, plan_nodes

    return plan_nodes(setup, node_counts(asked), trials=min(runs, main_runs), of=main_runs)


def node_json(plan: NodePlan, asked: int) -> dict[str, Any]:
    return {"runs": plan.runs, "parallel": asked, "levers": list(plan.levers),
            "confirmation": False, "rows": [r.to_json() for r in plan.rows]}


def node_lines(plan: NodePlan, asked: int, main_runs: int,
               dur: Callable[[float], str]) -> list[str]:
    """The table and how to read it (`main_runs`: the single-node plan's simulated runs)."""
    fewer = (f"; {plan.runs} simulated bisects per row, the first {plan.runs} of the "
             f"{main_runs} above" if plan.runs < main_runs else "")
    header = (f"{'nodes':>5}  {'levers':<7}  {'wall':>7}  {'p90':>7}  {'rounds':>6}  "
              f"{'trials':>6}  {'launches':>8}  {'idle slots':>10}  {'idle time':>9}  P(correct)")
    title = ("on Ray nodes (--executor ray; the same culprit sets and outcome streams in every "
             f"row{fewer}):")
    out = [title, f"  {header}"]
    for r in plan.rows:
        mark = "  <- --parallel" if r.nodes == asked and asked != 1 else ""
        out.append(f"  {r.nodes:>5}  {'with' if r.levers else 'without':<7}  "
                   f"{dur(r.mean_wall_s):>7}  {dur(r.p90_wall_s):>7}  {r.mean_rounds:>6.1f}  "
                   f"{r.mean_trials:>6.1f}  {r.mean_launches:>8.1f}  {r.mean_idle_slots:>10.1f}  "
                   f"{r.idle_share:>9.0%}  {r.p_correct:>10.2f}{mark}")
    out.append("  a round: up to K proposals, one per node, as long as its slowest trial; idle "
               "slots: node-rounds with no trial; idle time: the share of node time (K x wall) "
               "with no work (empty slots and nodes waiting for the round's slowest trial)")
    out.append("  as the Ray executor runs it: a trial goes to the free node whose engine is up in "
               "its load-time state, else to the node free longest; each node keeps its own "
               "engine; hot runners share the ends (a good end's baseline and A/A repeat, the "
               "bad end's run) from the round after the one that measured them, so a node "
               "measures no good end another measured and probes sequentially once any node "
               "ran the bad end; with fresh launches each node measures its own baselines; no "
               "fresh confirmation (the Ray executor cannot launch fresh), so 1 node is the "
               "plan above")
    out.append(f"  {_saving(plan)}")
    return out


def _saving(plan: NodePlan) -> str:
    """What more nodes save against one, with the levers and without (the same draws)."""
    counts = sorted({r.nodes for r in plan.rows if r.nodes > 1})

    def shares(levers: bool) -> list[float]:
        one = plan.row(1, levers).mean_wall_s
        return [1 - plan.row(k, levers).mean_wall_s / one if one > 0 else 0.0 for k in counts]

    def listed(items: list[str]) -> str:
        return ", ".join(items[:-1]) + " and " * (len(items) > 1) + items[-1]

    on, off = shares(True), shares(False)
    nodes = listed([str(k) for k in counts])
    line = (f"with the levers, {nodes} nodes save {listed([f'{s:.0%}' for s in on])} of one "
            f"node's wall time (without any lever {listed([f'{s:.0%}' for s in off])})")
    if max(on) < max(off):
        line += (": most of a hot bisect is its ends and the launches for load-time states, "
                 "which more nodes do not shorten")
    return line + " (docs/cluster.md, \"Reading the node plan\")"
