"""The node table of `bisect --plan --executor ray`, rendered: the whole bisect on 1, 2 and 4
nodes (and the K of `--parallel` where it is another), with every lever and without any, from
one simulation (bisect/plan/parallel_plan.py, run by bisect/session.py; docs/cluster.md,
"Reading the node plan")."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy and the search: imported when the plan runs, not with the CLI
    from dsv4bisect.bisect.plan.parallel_plan import NodePlan


def node_json(plan: NodePlan, asked: int, costs: list[dict[str, Any]]) -> dict[str, Any]:
    """`nodes` of `--plan --json`: the rows, the floor per node count, and the costs they are
    priced with (each with its source: the single-node plan's)."""
    return {"runs": plan.runs, "parallel": asked, "levers": list(plan.levers),
            "confirmation": False, "rows": [r.to_json() for r in plan.rows],
            "floor": [{"nodes": k, "wall_s": s} for k, s in plan.floor_s],
            "costs": costs}


def node_lines(plan: NodePlan, asked: int, main_runs: int,
               dur: Callable[[float], str]) -> list[str]:
    """The table and how to read it (`main_runs`: the single-node plan's simulated runs)."""
    fewer = (f"; {plan.runs} simulated bisects per row, the first {plan.runs} of the "
             f"{main_runs} above" if plan.runs < main_runs else "")
    header = (f"{'nodes':>5}  {'levers':<7}  {'sharded':<16}  {'wall':>7}  {'p90':>7}  "
              f"{'rounds':>6}  {'trials':>6}  {'launches':>8}  {'idle slots':>10}  "
              f"{'idle time':>9}  P(correct)")
    title = ("on Ray nodes (--executor ray; the same culprit sets and outcome streams in every "
             f"row{fewer}):")
    out = [title, f"  {header}"]
    for r in plan.rows:
        mark = "  <- --parallel" if r.nodes == asked and asked != 1 else ""
        shard = ("yes" if r.sharded else "no") + (f" /{r.round_size}" if r.sharded
                                                 and r.round_size != r.nodes else "") + (
            f" {r.ends}" if r.ends and r.nodes > 1 else "")
        out.append(f"  {r.nodes:>5}  {'with' if r.levers else 'without':<7}  {shard:<16}  "
                   f"{dur(r.mean_wall_s):>7}  {dur(r.p90_wall_s):>7}  {r.mean_rounds:>6.1f}  "
                   f"{r.mean_trials:>6.1f}  {r.mean_launches:>8.1f}  {r.mean_idle_slots:>10.1f}  "
                   f"{r.idle_share:>9.0%}  {r.p_correct:>10.2f}{mark}")
    out.append("  a round: up to K proposals, as long as its slowest trial; idle slots: "
               "node-rounds with no trial; idle time: the share of node time (K x wall) with no "
               "work (empty slots and nodes waiting for the round's slowest trial or shard)")
    out.append("  as the Ray executor runs it: a trial goes to the free node whose engine is up in "
               "its load-time state, else to the node free longest; each node keeps its own "
               "engine; hot runners share the ends (a good end's baseline and A/A repeat, the "
               "bad end's run) from the round after the one that measured them, so a node "
               "measures no good end another measured and probes sequentially once any node "
               "ran the bad end; with fresh launches each node measures its own baselines; no "
               "fresh confirmation (the Ray executor cannot launch fresh), so 1 node is the "
               "plan above")
    out.append("  sharded (hot runners; --no-shard turns it off): the schedule the Ray "
               "executor runs: the ends run in a round of their own, their full-size probes "
               "split across the nodes (each paying its own launch or switch, an end lasting as "
               "long as its slowest shard), 'alone' (the good end on every node, then the bad "
               "end), 'together' (each on half of the nodes at once, the bad end sending its "
               "accuracy requests while the good end runs and scoring its drift transcripts "
               "against the good end's run once it is back) or, on 3 or more nodes, 'beside' "
               "(each end on one node, unsharded, and on the other nodes the search's first "
               "trials, probed at the ends' look and started ahead of the good end's run like "
               "the bad end), whichever this simulation prices "
               "lower for K (the Ray executor runs that one); every other trial runs on a node "
               "of its own, unsharded (its probe is shorter than a replica's switch), up to K a "
               "round; '/N': --nodes K --parallel N (N trials a round after the ends), priced "
               "lower than --parallel K; not sharded, a bad end beside the good end of its seed "
               "block starts ahead of it the same way and measures no baseline of its own")
    out.append("  costs: those above, unchanged, on every node")
    out.append("  floor (what a bisect told the culprits must still run: the two ends as the "
               "sharded row runs them, and one trial of the culprits, every lever): "
               + ", ".join(f"{dur(s)} on {k} node{'s' * (k > 1)}" for k, s in plan.floor_s))
    out.append(f"  {_saving(plan, dur)}")
    return out


def _saving(plan: NodePlan, dur: Callable[[float], str]) -> str:
    """What more nodes save against one, with the levers (sharded and not) and without."""
    counts = sorted({r.nodes for r in plan.rows if r.nodes > 1})

    def shares(levers: bool, sharded: bool) -> list[str]:
        one = plan.row(1, levers).mean_wall_s
        return [f"{plan.row(k, levers, sharded).mean_wall_s / one:.2f}x" if one > 0 else "-"
                for k in counts]

    def listed(items: list[str]) -> str:
        return ", ".join(items[:-1]) + " and " * (len(items) > 1) + items[-1]

    nodes = listed([str(k) for k in counts])
    gains = [plan.row(k, True).mean_wall_s - plan.row(k, True, True).mean_wall_s
             for k in counts]  # negative where sharding is priced longer
    saves = listed([f"{'saves' if g >= 0 else 'costs'} {dur(abs(g))}" for g in gains])
    return (f"sharding {saves} with the levers on {nodes} nodes; "
            f"with the levers and sharding, {nodes} nodes take "
            f"{listed(shares(True, True))} of one node's wall time (not sharded "
            f"{listed(shares(True, False))}; without any lever, sharded "
            f"{listed(shares(False, True))}, not sharded {listed(shares(False, False))}) "
            "(docs/cluster.md, \"Reading the node plan\")")
