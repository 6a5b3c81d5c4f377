"""Time a bisect with hot switching against the same bisect with `--fresh-launches`, side by side.

    python tests/benchmarks/hot_vs_fresh.py [--tier smoke] [--fault mma-decode:merge-no-rescale]
        [--candidates P,Q] [--precision exact] [--warn-as pass]

The question of the bisect end-to-end tests (tests/bisect/test_bisect_e2e.py): `--precision
exact` (at `deployment` the bf16 patches fail the drift gate on their own,
docs/reference-engine.md) and `--warn-as pass` (at `exact` they WARN: counted as FAIL, each
would be a culprit of its own), so the fault is the only culprit.

Each mode runs `dsv4bisect bisect reference-all` in its own process with its own runs root and
its own baseline cache (so both measure the good end), one after the other on the same machine.
Printed per mode: the culprit, wall time, engine launches (engine records written: one per
launched engine directory), probe requests (summed over every trial the bisect ran, from the
ledger: baseline, A/A repeat, trial probes, the remedy check and the fresh confirmation), the
search's steps and their modes. docs/performance.md keeps the output.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_mode(root: Path, mode: str, args: argparse.Namespace) -> dict[str, object]:
    name, _, variant = args.fault.partition(":")
    argv = [sys.executable, "-m", "dsv4bisect", "bisect", "reference-all", "--tier", args.tier,
            "--set", f"patches.{name}.variant={variant}", "--set",
            f"engine.precision={args.precision}", "--warn-as", args.warn_as, "--json", "--out",
            str(root / "runs")]
    if args.candidates:
        argv += ["--candidates", args.candidates]
    if mode == "fresh":
        argv.append("--fresh-launches")
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "NO_COLOR": "1", "DSV4BISECT_CACHE": str(root / "cache")}
    t0 = time.monotonic()
    r = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if r.returncode not in (0, 1):
        raise SystemExit(f"{mode}: exit {r.returncode}\n{r.stderr[-3000:]}")
    report = json.loads(r.stdout)
    run_dir = Path(report["run_dir"])
    with sqlite3.connect(root / "runs" / "ledger.sqlite") as conn:
        details = [json.loads(d or "{}") for (d,) in conn.execute("SELECT details FROM trials")]
    return {
        "mode": mode, "status": report["status"], "culprits": report["culprits"],
        "wall_s": round(wall, 1), "launches": len(list(run_dir.rglob("engines.json"))),
        "requests": sum(int(d.get("requests") or 0) for d in details),
        "trials": len(details), "steps": len(report["trials"]),
        "modes": [t.get("mode") for t in report["trials"]],
        "remedy": (report.get("remedy") or {}).get("verdict"),
        "confirmation": report.get("confirmation"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", default="smoke")
    parser.add_argument("--fault", default="mma-decode:merge-no-rescale")
    parser.add_argument("--candidates", default=None)
    parser.add_argument("--precision", default="exact")
    parser.add_argument("--warn-as", default="pass")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hot-vs-fresh-") as tmp:
        rows = [run_mode(Path(tmp) / mode, mode, args) for mode in ("hot", "fresh")]
    for row in rows:
        print(json.dumps(row))
    hot, fresh = rows
    print(f"same culprit: {hot['culprits'] == fresh['culprits']}; requests hot/fresh: "
          f"{hot['requests']}/{fresh['requests']} = "
          f"{hot['requests'] / max(1, fresh['requests']):.2f}; wall hot/fresh: "
          f"{hot['wall_s']}/{fresh['wall_s']} s")


if __name__ == "__main__":
    main()
