"""The least a bisect could spend if it already knew the culprits: the floor under `--plan`.

    python tests/benchmarks/plan_floor.py dsv4-flash-tp8-latest-all

Reads the plan's own costs (`dsv4bisect bisect PROFILE --plan --json`) and, for every culprit
set of the flat prior the plan draws from (half the mass on singles, half on pairs, every
candidate alike), prices with the same `pricing.CostTracker` the trials a bisect must run even
when it is told the answer and no probe ever errs: the two ends (full probe, the good end's A/A
repeat; at look 1 where the plan prices the ends' two looks), the culprit set in a launch of its
own (the fresh confirmation), for a pair each member alone passing ("C minus x passes", in an
engine that is up or in the remedy's load-time state where it can be), and the remedy check (the
bad end without the culprits) where its engine is up or last. No search trial is counted: a real
bisect adds the trials that find the culprits (log2 of the 21 culprit sets at the trial probe's
channel capacity) and its noise repeats. Prints the floor per culprit set and its mean over the
prior (docs/bisect.md quotes it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys

from dsv4bisect.bisect.search.pricing import CostTracker, StepCosts


def plan_costs(profile: str) -> tuple[tuple[str, ...], StepCosts]:
    out = subprocess.run([sys.executable, "-m", "dsv4bisect", "bisect", profile, "--plan",
                          "--json"], check=True, capture_output=True, text=True).stdout
    plan = json.loads(out)
    lines = {line["name"].split(" (")[0]: line["value"] for line in plan["costs"]}
    return tuple(plan["candidates"]), StepCosts(
        launch_s=lines["launch"], switch_s=lines["hot switch"], probe_s=lines["full probe"],
        aa_fraction=lines["A/A repeat"], sequential=True,
        like_good_fraction=lines["trial probe, like the good end"],
        like_bad_fraction=lines["trial probe, like the bad end"], hot=plan["hot"],
        pool=int(lines["engines kept up"]), load_time=frozenset(plan["load_time"]), paired=True,
        # the ends' two looks where the plan prices them (bisect/end_looks.py)
        **({"look1_fraction": lines["ends, look 1"],
            "look1_aa_fraction": lines["ends, look 1, A/A repeat"],
            "look2_chance": lines["ends, look 2"]} if "ends, look 1" in lines else {}))


def floor_s(candidates: tuple[str, ...], costs: StepCosts, culprits: frozenset[str]) -> float:
    everything = frozenset(candidates)
    load = costs.load_time
    t = CostTracker(costs, everything)
    rest = everything - culprits  # the remedy check's configuration
    done: set[frozenset[str]] = set()

    def run(subset: frozenset[str]) -> None:
        t.charge(subset, culprits <= subset)
        done.add(subset)

    def remedy_if_up() -> None:
        if rest not in done and t.engine_up(rest):
            run(rest)

    run(frozenset())
    remedy_if_up()
    run(everything)
    remedy_if_up()
    if t.engine_up(culprits):  # its engine is up but not a launch of it: the confirmation
        run(culprits)
        t.confirmation(True)
    else:
        run(culprits)  # launched in itself: a failing fresh launch is the confirmation
    todo = sorted(culprits) if len(culprits) > 1 else []
    while todo:  # C minus x passes: any T ⊇ C - {x} without x; a switch before a launch
        picks = {x: _check_config(culprits - {x}, x, t, rest & load, load) for x in todo}
        x = next((x for x in todo if t.engine_up(picks[x])), todo[0])
        todo.remove(x)
        run(picks[x])
        remedy_if_up()
    if rest not in done:
        run(rest)
    return t.spent_s


def _check_config(need: frozenset[str], x: str, t: CostTracker, remedy_state: frozenset[str],
                  load: frozenset[str]) -> frozenset[str]:
    """C minus x in an engine that is up where it can run there, else in the remedy's state."""
    states = [s for s in (*t.engines, remedy_state) if need & load <= s and x not in s]
    state = next((s for s in states if t.engine_up(need | s)), states[0] if states else
                 need & load)
    return need | state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    args = parser.parse_args()
    candidates, costs = plan_costs(args.profile)
    sets = [frozenset(c) for k in (1, 2) for c in itertools.combinations(candidates, k)]
    n1, n2 = len(candidates), len(sets) - len(candidates)
    mean = 0.0
    for s in sets:
        seconds = floor_s(candidates, costs, s)
        mean += seconds * (0.5 / n1 if len(s) == 1 else 0.5 / n2)
        print(f"{', '.join(sorted(s)):45s} {seconds / 60:6.1f} min")
    print(f"floor over the flat prior: {mean / 60:.1f} min (costs of `{args.profile} --plan`; "
          "no search trials, no noise)")


if __name__ == "__main__":
    main()
