"""Where a bisect's time goes once the ends stop early: the plan's own simulation with the ends'
probes (and the good end's A/A repeat) at a share of the full tier. What-if only: the driver
runs full-size ends today (issue 42, item 2, is not built); this prices what building it would
buy, and the floor under the other costs (launches, switches, trials) that no end can move.

    python tests/benchmarks/plan_what_if.py dsv4-flash-tp8-latest-all [--runs 400]
        [--shares 1 0.25 0.1 0.05 0]

Reads the plan's costs (`dsv4bisect bisect PROFILE --plan --json --executor ray --parallel 4`,
so the same costs and trial noise), rebuilds the simulated bisect (`Setup`, the tier prior
weights: the SGLang profiles' microtest priors are off here) and, per share, simulates the one-node row and
the best four-node sharded row on the plan's culprit sets and outcome streams
(`parallel_plan.plan_nodes`'s), and the floor (`floor_run`: the ends and one trial of the
culprits). Share 1 must give the plan's own rows back (checked).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace

import numpy as np

from dsv4bisect.bisect.plan.parallel_plan import floor_run, sharded_row
from dsv4bisect.bisect.plan.parallel_plan import _row as node_row
from dsv4bisect.bisect.plan.simulate import Setup, common_draws
from dsv4bisect.bisect.question import resolve_question
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.pricing import StepCosts
from dsv4bisect.bisect.setup import tier_priors
from dsv4bisect.config.resolve import Overrides


def plan_setup(profile: str) -> tuple[Setup, dict]:
    out = subprocess.run([sys.executable, "-m", "dsv4bisect", "bisect", profile, "--plan",
                          "--json", "--executor", "ray", "--parallel", "4"], check=True,
                         capture_output=True, text=True).stdout
    plan = json.loads(out)
    lines = {line["name"].split(" (")[0]: line["value"] for line in plan["costs"]}
    costs = StepCosts(
        launch_s=lines["launch"], switch_s=lines["hot switch"], probe_s=lines["full probe"],
        aa_fraction=lines["A/A repeat"], sequential=True,
        like_good_fraction=lines["trial probe, like the good end"],
        like_bad_fraction=lines["trial probe, like the bad end"], hot=plan["hot"],
        pool=int(lines["engines kept up"]), load_time=frozenset(plan["load_time"]),
        paired=True, drift_fraction=lines["drift scoring"])
    noise = Noise(plan["noise"]["false_fail"], plan["noise"]["false_pass"])
    trial = Noise(plan["trial_noise"]["false_fail"], plan["trial_noise"]["false_pass"])
    question = resolve_question(profile, Overrides())
    weights = tier_priors(question)  # the prior weights the plan searches with (no microtest)
    cfg = question.bisect
    return Setup(tuple(plan["candidates"]), noise, trial, costs, cfg.confidence,
                 max_trials=cfg.max_trials, weights=weights, base_weights=weights,
                 confirm=False), plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("profile")
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--shares", type=float, nargs="+", default=[1.0, 0.25, 0.1, 0.05, 0.0])
    args = ap.parse_args()
    setup, plan = plan_setup(args.profile)
    culprits, seeds = common_draws(setup, args.runs, 0)
    rows = {(r["nodes"], r["sharded"]): r for r in plan["nodes"]["rows"] if r["levers"]}
    print(f"{args.profile}: launch {setup.costs.launch_s:.0f} s, switch "
          f"{setup.costs.switch_s:.0f} s, full probe {setup.costs.probe_s:.0f} s, "
          f"{args.runs} simulated bisects per row")
    print(f"{'ends':>6}  {'1 node':>7}  {'p90':>6}  {'P(ok)':>5}  {'launches':>8}  "
          f"{'4 nodes':>7}  {'p90':>6}  {'floor 1':>7}  {'floor 4':>7}")
    for share in args.shares:
        cfg = replace(setup, costs=replace(setup.costs, end_fraction=share))
        one = node_row(cfg, 1, 1, True, True, False, culprits, seeds)
        four = sharded_row(cfg, 4, True, True, culprits, seeds)
        floors = [float(np.mean([floor_run(cfg, k, c, "together" if k > 1 else "alone")
                                 for c in culprits])) for k in (1, 4)]
        if share == 1.0 and args.runs == plan["nodes"]["runs"]:  # the plan's own rows back
            assert abs(one.mean_wall_s - rows[(1, False)]["mean_wall_s"]) < 1e-6, one
            assert abs(four.mean_wall_s - rows[(4, True)]["mean_wall_s"]) < 1e-6, four
        print(f"{share:>6.2f}  {one.mean_wall_s:>7.0f}  {one.p90_wall_s:>6.0f}  "
              f"{one.p_correct:>5.3f}  {one.mean_launches:>8.2f}  {four.mean_wall_s:>7.0f}  "
              f"{four.p90_wall_s:>6.0f}  {floors[0]:>7.0f}  {floors[1]:>7.0f}", flush=True)


if __name__ == "__main__":
    main()
