"""Two trees' default bisects of the same faults, back to back in A-B-B-A order (issue 42's
wall-time check: "≥ 1.5× faster, the same culprit in one round with the remedy passing").

    python tests/benchmarks/abba_bisect.py --a REV_BEFORE --b REV_AFTER \
        [--faults mma-decode:swa-ring-stale mma-decode:batch-kv-slot nextn-speculation:draft-eos] \
        [--order ABBA] [--out DIR] [--dry-run]

Each revision is checked out once as a detached git worktree under `--out` and imported from
there (kernels/, patches/ and profiles/ linked under the package, as on the GPU box), so neither
needs installing. Every bisect is `python -m dsv4bisect bisect reference-all --set
patches.P.variant=V --json` with a fresh cache (`DSV4BISECT_CACHE`: no baseline, no trial plan
or priors carried between runs) and a runs root of its own (a fresh ledger: no trial verdict or
measured launch time carried from an earlier run), one at a time, per fault in the `--order` given
(A-B-B-A cancels a load that drifts linearly over the four). Each run's JSON (command,
revision, exit code, status, culprits, trials, remedy, wall time, the load average before and
after) goes to `--out/runs.jsonl`; the summary prints per fault the median wall time of each
tree, their ratio, and whether every run named the fault's patch alone with the remedy passing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAULTS = ("mma-decode:swa-ring-stale", "mma-decode:batch-kv-slot", "nextn-speculation:draft-eos")


def checkout(rev: str, out: Path) -> Path:
    """A detached worktree of `rev`, importable without installing."""
    sha = subprocess.run(["git", "rev-parse", rev], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    tree = out / f"tree-{sha[:10]}"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT,
                       check=True, capture_output=True)
    for d in ("kernels", "patches", "profiles"):
        link = tree / "dsv4bisect" / d
        if not link.exists():
            link.symlink_to(Path("..") / d)
    return tree


def bisect(tree: Path, fault: str, runs: Path) -> dict:
    """One default bisect of `fault` from `tree`, with a cache and a runs root (`runs`, whose
    ledger is the bisect's own) of its own."""
    patch, variant = fault.split(":")
    args = ["bisect", "reference-all", "--set", f"patches.{patch}.variant={variant}",
            "--out", str(runs), "--json"]
    with tempfile.TemporaryDirectory(prefix="abba-cache-") as cache:
        env = {**os.environ, "PYTHONPATH": str(tree), "DSV4BISECT_CACHE": cache}
        load0, start = os.getloadavg()[0], time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "dsv4bisect", *args], cwd=tree, env=env,
                              capture_output=True, text=True, check=False)
        wall = time.monotonic() - start
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = {}
    remedy = doc.get("remedy") or {}
    return {"fault": fault, "tree": tree.name, "command": ["dsv4bisect", *args],
            "rc": proc.returncode, "status": doc.get("status"), "culprits": doc.get("culprits"),
            "trials": len(doc.get("trials") or ()), "remedy": remedy.get("verdict"),
            "run_dir": doc.get("run_dir"), "wall_s": round(wall, 1),
            "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "stderr_tail": proc.stderr[-1500:] if proc.returncode else ""}


def summary(rows: list[dict], trees: dict[str, Path]) -> str:
    lines = ["| fault | A median (s) | B median (s) | A / B | every run: culprit alone, remedy "
             "passes | load |", "| --- | ---: | ---: | ---: | --- | --- |"]
    for fault in dict.fromkeys(r["fault"] for r in rows):
        mine = [r for r in rows if r["fault"] == fault]
        med = {k: statistics.median(r["wall_s"] for r in mine if r["tree"] == t.name)
               for k, t in trees.items() if any(r["tree"] == t.name for r in mine)}
        right = all(r["culprits"] == [fault.split(":")[0]] and r["remedy"] == "passes"
                    for r in mine)
        ratio = f"{med['A'] / med['B']:.2f}×" if len(med) == 2 else "-"
        loads = ", ".join(f"{r['load'][0]}–{r['load'][1]}" for r in mine)
        lines.append(f"| {fault} | {med.get('A', '-')} | {med.get('B', '-')} | {ratio} | "
                     f"{'yes' if right else 'NO'} | {loads} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="the tree before (a revision)")
    ap.add_argument("--b", required=True, help="the tree after (a revision)")
    ap.add_argument("--faults", nargs="+", default=list(FAULTS), help="PATCH:VARIANT ...")
    ap.add_argument("--order", default="ABBA", help="the trees' order per fault, e.g. ABBA")
    ap.add_argument("--out", type=Path, default=Path("runs/abba"))
    ap.add_argument("--dry-run", action="store_true", help="print the schedule, run nothing")
    a = ap.parse_args()
    if set(a.order) - {"A", "B"} or not a.order:
        sys.exit("error: --order is a word of A and B\nhint: --order ABBA")
    if a.dry_run:
        for fault in a.faults:
            print(fault, " ".join({"A": a.a, "B": a.b}[x] for x in a.order))
        return
    a.out.mkdir(parents=True, exist_ok=True)
    trees = {"A": checkout(a.a, a.out.resolve()), "B": checkout(a.b, a.out.resolve())}
    rows = []
    with (a.out / "runs.jsonl").open("a") as log:
        for fault in a.faults:
            for i, which in enumerate(a.order):
                runs = a.out.resolve() / "runs" / f"{fault.replace(':', '-')}-{i}{which}"
                if runs.exists():
                    sys.exit(f"error: {runs} exists\nhint: give a new --out (a fresh ledger "
                             "per bisect)")
                runs.parent.mkdir(parents=True, exist_ok=True)
                row = bisect(trees[which], fault, runs)
                print(json.dumps(row), file=log, flush=True)
                print(f"{fault} {which}: {row['status']} {row['culprits']} {row['wall_s']} s",
                      file=sys.stderr, flush=True)
                rows.append(row)
    print(summary(rows, trees))


if __name__ == "__main__":
    main()
