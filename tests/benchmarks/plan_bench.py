"""How long `dsv4bisect bisect PROFILE --plan` takes to answer (wall and CPU seconds), with the
load, cold (an empty cache: the microtest priors are measured) and warm (they come from the
priors cache, bisect/priors_cache.py).

    python tests/benchmarks/plan_bench.py [--profile reference-all] [--repeat 5]

Each run is a fresh process with `--plan --json`, as a user runs it, against a cache directory
of its own (DSV4BISECT_CACHE in a temporary folder: the user's cache is not read): the first run
is cold, the others warm. Every run's JSON must be the same (the cache changes no figure);
prints one line per run and the warm median. The figures in docs/performance.md ("bisect
--plan") come from this script.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def once(profile: str, cache: str) -> tuple[float, float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dsv4bisect", "bisect", profile, "--plan",
                           "--json"], check=True, capture_output=True, text=True,
                          env={**os.environ, "DSV4BISECT_CACHE": cache})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, load, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="reference-all")
    ap.add_argument("--repeat", type=int, default=5, help="runs, the first one cold")
    args = ap.parse_args()
    walls, plans = [], set()
    with tempfile.TemporaryDirectory(prefix="plan-bench-") as cache:
        for i in range(args.repeat):
            wall, cpu, load, plan = once(args.profile, cache)
            plans.add(plan)
            kind = "cold" if i == 0 else "warm"
            if i:
                walls.append(wall)
            print(f"bisect {args.profile} --plan ({kind}): {wall:.2f} s wall, {cpu:.2f} s CPU, "
                  f"load {load:.1f}", flush=True)
    if len(plans) != 1:
        sys.exit("the plans differ between runs")
    if walls:
        print(f"warm median {statistics.median(walls):.2f} s over {len(walls)}; "
              "every run's plan the same")


if __name__ == "__main__":
    main()
