"""How long `dsv4bisect doctor PROFILE` takes to answer (wall and CPU seconds), with the load.

    python tests/benchmarks/doctor_bench.py [--profile reference-all] [--repeat 5]

Each repeat is a fresh process, as a user runs it; prints one line per repeat and the median.
The figure in docs/performance.md ("doctor") comes from this script.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time


def once(profile: str) -> tuple[float, float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "dsv4bisect", "doctor", profile], check=True,
                   capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="reference-all")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    walls = []
    for i in range(args.repeat):
        wall, cpu, load = once(args.profile)
        walls.append(wall)
        print(f"doctor {args.profile}: {wall:.2f} s wall, {cpu:.2f} s CPU, load {load:.1f} "
              f"(repeat {i + 1})", flush=True)
    print(f"median {statistics.median(walls):.2f} s over {len(walls)}")


if __name__ == "__main__":
    main()
