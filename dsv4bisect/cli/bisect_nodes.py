"""The node table of `bisect --plan --executor ray`: the whole bisect on 1, 2 and 4 nodes (and
the K of `--parallel` where it is another), with every lever and without any, from one
simulation (bisect/parallel_plan.py; docs/cluster.md, "Reading the node plan")."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy and the search: imported when the plan runs, not with the CLI
    from dsv4bisect.bisect.parallel_plan import NodePlan
    from dsv4bisect.bisect.whole_plan import Setup

# Simulated bisects per row: fewer than the single-node plan's, so that 6-8 rows of rounds of
# up to K proposals (each scored over 2^K outcome patterns) stay within a few seconds.
NODE_PLAN_RUNS = 100


def node_plan(setup: Setup, asked: int, main_runs: int, runs: int = NODE_PLAN_RUNS) -> NodePlan:
    """The rows, on the first `runs` culprit sets and outcome streams of the single-node plan
    of `main_runs` bisects."""
    from dsv4bisect.bisect.parallel_plan import node_counts, plan_nodes

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
    out.append("  as the Ray executor runs it: the node free longest takes the next trial; each "
               "node keeps its own engine and measures its own good end (launch, full probe, "
               "A/A repeat) for each seed block it tests; a node probes with the sequential "
               "trial probe only after it ran the bad end itself, at full size before; no fresh "
               "confirmation (the Ray executor cannot launch fresh), so 1 node is the plan "
               "above less its confirmation")
    one = plan.row(1, True).mean_wall_s
    slower = [r.nodes for r in plan.rows if r.levers and r.nodes > 1 and r.mean_wall_s > one]
    if slower:
        counts = ", ".join(map(str, slower[:-1])) + " and " * (len(slower) > 1) + str(slower[-1])
        out.append(f"  with the levers, {counts} nodes take longer than one: only the node that "
                   "ran the bad end probes sequentially, the others at full size and the ends' "
                   "error rates, each after its own good end (docs/cluster.md, \"Reading the "
                   "node plan\")")
    return out
