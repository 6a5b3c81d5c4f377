"""`bisect --executor ray` after the `run` that failed, against the same bisect measuring its
own ends (`--no-cache`), on a local two-node Ray cluster whose nodes have caches of their own
(docs/cluster.md, "The ends a failing `run` cached travel too"). The question is the Ray test's
(tests/bisect/test_ray_run_ends_e2e.py): the six patches on and double-scale, ci tier, embedded
engine. Prints each command's wall seconds, the requests block 0's ends sent, and the engines
the nodes launched, for docs/performance.md.

    python tests/benchmarks/ray_after_run.py [--out DIR]     (needs `pip install '.[ray]'`)
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

from ray.cluster_utils import Cluster

SLOT = "trial_slot"
QUESTION = ("reference-all", "--tier", "ci", "--set", "engine.precision=exact",
            "--set", "patches.hash-topk-scaling.variant=double-scale")


def cli(*args: str, cache: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "dsv4bisect", *args],
                       env={**os.environ, "NO_COLOR": "1", "DSV4BISECT_CACHE": str(cache)},
                       capture_output=True, text=True, check=False)
    return r, time.monotonic() - t0


def block0_ends(out: Path) -> tuple[int, int]:
    """The trials of block 0's ends in `out`'s ledger and the requests they sent."""
    with sqlite3.connect(out / "ledger.sqlite") as conn:
        rows = conn.execute("SELECT subset, seed_block, details FROM trials "
                            "WHERE status = 'done'").fetchall()
    ends = [json.loads(d) for s, b, d in rows if b == 0 and (s == "[]" or len(json.loads(s)) == 5)]
    return len(ends), sum(int(d.get("requests") or 0) for d in ends)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    root = ap.parse_args().out or Path(tempfile.mkdtemp(prefix="ray-after-run-"))
    root.mkdir(parents=True, exist_ok=True)
    caches = [root / "cache-head", root / "cache-node"]
    os.environ["DSV4BISECT_CACHE"] = str(caches[0])  # each raylet keeps the env it starts with
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {SLOT: 1}})
    try:
        os.environ["DSV4BISECT_CACHE"] = str(caches[1])
        c.add_node(num_cpus=1, resources={SLOT: 1})
        c.wait_for_nodes()
        driver = root / "cache-driver"
        r, wall = cli("run", *QUESTION, "--json", "--out", str(root / "run"), cache=driver)
        if not r.stdout:
            sys.exit(r.stderr[-3000:])
        print(f"run: {json.loads(r.stdout)['verdict']}, {wall:.1f} s")
        ray_args = ("--warn-as", "auto", "--parallel", "2", "--executor", "ray",
                    "--ray-address", c.address, "--set", f"bisect.node_resource={SLOT}", "--json")
        for name, extra in (("after the run", ()), ("--no-cache", ("--no-cache",))):
            out = root / name.replace(" ", "-").strip("-")
            r, wall = cli("bisect", *QUESTION, *ray_args, *extra, "--out", str(out), cache=driver)
            if r.returncode != 0:
                sys.exit(r.stderr[-3000:])
            doc = json.loads(r.stdout)
            launched = sum(len(list(d.glob("*"))) for cache in caches for d in
                           (cache / "ray-trials").glob(f"*/{Path(doc['run_dir']).name}/engines"))
            trials, requests = block0_ends(out)
            print(f"bisect {name}: {wall:.1f} s, culprits {doc['culprits']}, "
                  f"{len(doc['trials'])} trials, block 0's ends {requests} requests in {trials} "
                  f"trials, {launched} engines launched on the nodes")
    finally:
        c.shutdown()


if __name__ == "__main__":
    main()
