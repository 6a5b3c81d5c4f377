"""`dsv4bisect localise` on the embedded engine: wall and CPU time for one case (the issue's target:
<= 2 min on the 2-core CPU), per stage, with the machine's load before and after.

    python tests/benchmarks/localise_bench.py                                  # the faults below
    python tests/benchmarks/localise_bench.py --rows merge-no-rescale harmless --json OUT.json

Each row runs the real command line (`python -m dsv4bisect localise reference ...`, one case:
the smoke tier's longest drift transcript) in a subprocess and reads its own `seconds` from
the JSON it prints; CPU time is the child's user + system time. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROWS = {
    "scale-layout": ["--only", "fp8-wo-a-gemm", "--set",
                     "patches.fp8-wo-a-gemm.variant=scale-layout"],
    "merge-no-rescale": ["--only", "mma-decode", "--set",
                         "patches.mma-decode.variant=merge-no-rescale"],
    "swa-ring-stale": ["--only", "mma-decode", "--set",
                       "patches.mma-decode.variant=swa-ring-stale"],
    "draft-eos": ["--only", "nextn-speculation", "--set",
                  "patches.nextn-speculation.variant=draft-eos"],
    "harmless": ["--set", "engine.chunked_prefill_size=512"],
}


def _load() -> float:
    return os.getloadavg()[0]


def run(name: str, out: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0, t0 = _load(), time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dsv4bisect", "localise", "reference",
                           *ROWS[name], "--json", "--out", out], capture_output=True, text=True,
                          check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    res = json.loads(proc.stdout)
    first = res["first_divergence"]
    return {"row": name, "wall_s": round(wall, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "load_before": round(load0, 1), "load_after": round(_load(), 1),
            "tokens": sum(c["tokens"] for c in res["cases"]),
            "first": None if first is None else f"{first['module']} {first['op']}",
            "stages": res["seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        rows = [run(name, out) for name in args.rows]
    print("| row | first divergence | tokens | wall s | CPU s | load before/after | stages (s) |")
    print("| --- | --- | ---: | ---: | ---: | --- | --- |")
    for r in rows:
        stages = ", ".join(f"{k} {v}" for k, v in r["stages"].items())
        print(f"| {r['row']} | {r['first']} | {r['tokens']} | {r['wall_s']} | {r['cpu_s']} | "
              f"{r['load_before']} / {r['load_after']} | {stages} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
