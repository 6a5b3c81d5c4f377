"""The verdict table of docs/reference-engine.md: what `run` and `bisect` say about every real
patch, every harmless change and every fault, at both precisions.

    python tests/benchmarks/verdict_table.py [--precision deployment exact] [--rows LABEL ...]
        [--tier smoke] [--device auto|cpu|cuda] [--jobs N] [--bisect | --bisect-rows LABEL ...]
        [--commit SHA] [--out docs/results/DIR] [--from DIR ...]

Per row and precision:
- the default run: `dsv4bisect run --json` (the profile `reference-all`, every patch of it on,
  against every patch off);
- a patch or a fault: `dsv4bisect run reference --only P [--set patches.P.variant=V] --json`
  (the good end is the same profile with every patch off);
- a harmless change the deployment makes to itself (prefill re-chunked at 512 / 77, no batch
  mates, no prefix-cache hit): `dsv4bisect run reference --good-config reference --set
  engine.SETTING=V --json`, the changed server judged against the default one (the serving
  settings are SGLang's server arguments, `serve --chunk-size` and its siblings). Until
  2026-12-06 these rows launched two `dsv4bisect serve` and judged `probe CHANGED --baseline
  DEFAULT`: the same comparison, but it measured the default server again in every row, where
  `run` reads the baseline every row shares from its cache (every row's good end is `reference`
  with no patch, one fingerprint), which on a GPU is the difference between fitting a lent
  machine's call or not;
- with `--bisect`, for faults: `dsv4bisect bisect reference-all [--set
  patches.P.variant=V] --json` (the slow part): the culprits it names, in how many rounds.
Columns: drift (as a multiple of the null model when the verdict reports one, else the mean KL
over the drift transcripts), answers lost of those paired, where they were lost (per arm@level,
the families' counts), the verdict, the bisect's culprits, its trials and whether one round
did (the bad end without the culprits passes), the device it ran on and the folder each result
is kept in. `--out` keeps every JSON, each with the device's name (`torch.cuda.get_device_name()`
on a GPU), the commit measured (`--commit`, else `$DSV4BISECT_COMMIT`, else `git rev-parse HEAD`)
and the wall time; `--from DIR ...` rebuilds the table from kept JSON without running anything
(per device, the first folder holding a result wins, so `--from GPU_DIR CPU_DIR` prints both
devices' rows side by side; a row with no JSON is printed as "not measured"; results kept before
the device was recorded were all measured on the 2-core CPU and say `cpu (unrecorded)`).

`--device` sets every engine's device (the profiles' own is `auto`: CUDA when present); `--jobs
N` measures N rows at once (each row's engines are their own processes, so rows do not share a
batch: on a GPU machine with spare cores this only saves wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Row:
    label: str
    kind: str  # default | patch | fault | harmless
    patch: str | None = None
    variant: str | None = None
    sets: tuple[str, ...] = ()  # harmless: the changed serving setting (engine.KEY=VALUE)
    citation: str = ""

    @property
    def key(self) -> str:
        return self.label.replace(" ", "_").replace("/", "-").replace(":", "-")


ROWS: tuple[Row, ...] = (
    Row("default run", "default"),
    Row("mhc-bf16", "patch", "mhc-bf16"),
    Row("hash-topk-scaling", "patch", "hash-topk-scaling"),
    Row("mma-decode", "patch", "mma-decode"),
    Row("triton-indexer", "patch", "triton-indexer"),
    Row("nvfp4-dispatch", "patch", "nvfp4-dispatch"),
    Row("trtllm-clamp", "patch", "trtllm-clamp"),
    Row("nextn-speculation", "patch", "nextn-speculation"),
    Row("fp8-wo-a-gemm", "patch", "fp8-wo-a-gemm"),
    Row("re-chunk 512", "harmless", sets=("engine.chunked_prefill_size=512",)),
    Row("re-chunk 77", "harmless", sets=("engine.chunked_prefill_size=77",)),
    Row("no batch mates", "harmless", sets=("engine.max_running_requests=1",)),
    Row("no cache hit", "harmless", sets=("engine.disable_radix_cache=true",)),
    Row("mma-decode:merge-no-rescale", "fault", "mma-decode", "merge-no-rescale"),
    Row("hash-topk-scaling:double-scale", "fault", "hash-topk-scaling", "double-scale"),
    Row("triton-indexer:residue", "fault", "triton-indexer", "residue"),
    Row("mma-decode:batch-kv-slot", "fault", "mma-decode", "batch-kv-slot"),
    Row("mma-decode:decode-rope-fp8", "fault", "mma-decode", "decode-rope-fp8"),
    Row("mma-decode:compress-rope-base", "fault", "mma-decode", "compress-rope-base"),
    Row("mma-decode:swa-ring-stale", "fault", "mma-decode", "swa-ring-stale"),
    Row("nextn-speculation:draft-eos", "fault", "nextn-speculation", "draft-eos"),
    Row("fp8-wo-a-gemm:scale-layout", "fault", "fp8-wo-a-gemm", "scale-layout",
        citation="sglang#29038"),
    Row("fp8-wo-a-gemm:scale-truncate", "fault", "fp8-wo-a-gemm", "scale-truncate",
        citation="sglang#39193"),
)


@dataclass(frozen=True)
class Where:
    """What every kept result records about where it was measured."""
    device: str  # auto | cpu | cuda: what the engines were told
    commit: str

    @property
    def device_name(self) -> str:
        return _device_name(self.device)


@cache
def _device_name(device: str) -> str:
    """The name of the device the engines run on (`auto`: CUDA when present, as the profiles)."""
    if device != "cpu":
        try:
            import torch

            if torch.cuda.is_available():
                return torch.cuda.get_device_name()
        except ImportError:
            pass
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def _commit(given: str | None) -> str:
    if given or os.environ.get("DSV4BISECT_COMMIT"):
        return given or os.environ["DSV4BISECT_COMMIT"]
    proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def _cli(args: list[str], out: Path | None, where: Where) -> tuple[int, dict[str, Any] | None]:
    """`python -m dsv4bisect ARGS --json`, niced; the JSON it prints (None if none)."""
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    cmd = ["nice", "-n", "10", sys.executable, "-m", "dsv4bisect", *args, "--json"]
    print("$", " ".join(cmd[3:]), file=sys.stderr, flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, check=False, cwd=ROOT, env=env, capture_output=True, text=True)
    try:
        doc = json.loads(proc.stdout) if proc.stdout.strip() else None
    except json.JSONDecodeError:
        doc = None
    if out is not None:
        out.write_text(json.dumps({"command": ["dsv4bisect", *args, "--json"],
                                   "rc": proc.returncode, "result": doc,
                                   "device": where.device_name, "commit": where.commit,
                                   "wall_s": round(time.monotonic() - start, 1),
                                   "stderr_tail": proc.stderr[-2000:]}, indent=1))
    return proc.returncode, doc


def _pythonpath() -> str:
    """The checkout first, then whatever the caller had (a GPU box's carried wheels)."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def _good_config(out: Path, precision: str, where: Where) -> Path:
    """The harmless rows' good end: `reference` (every patch off) at this precision and device,
    the same configuration, and fingerprint, as every other row's good end."""
    engine = {"precision": precision}
    if where.device != "auto":
        engine["reference"] = {"device": where.device}
    path = out / f"good-end.{precision}.{where.device}.yaml"
    path.write_text(json.dumps({"schema_version": 1, "extends": "reference",
                                "name": "reference", "engine": engine}) + "\n")
    return path


def measure(row: Row, precision: str, tier: str, out: Path, what: str, where: Where) -> None:
    """One result of `row` at `precision`: its `run` (or probe) or, `what="bisect"`, its
    default bisect."""
    exact = ["--set", "engine.precision=exact"] if precision == "exact" else []
    device = [] if where.device == "auto" else ["--set", f"engine.reference.device={where.device}"]
    tag = f"{row.key}.{precision}"
    sets = ["--set", f"patches.{row.patch}.variant={row.variant}"] if row.variant else []
    if what == "bisect":  # a real patch's bisect is reference-all's own
        _cli(["bisect", "reference-all", *sets, *exact, *device, "--out", str(out / "runs")],
             out / f"{tag}.bisect.json", where)
    elif row.kind == "harmless":  # --good-config: the user's --set shape the candidate only
        changed = [x for kv in (*row.sets, *exact[1::2], *device[1::2]) for x in ("--set", kv)]
        _cli(["run", "reference", "--good-config", str(_good_config(out, precision, where)),
              *changed, "--tier", tier, "--out", str(out / "runs")], out / f"{tag}.run.json",
             where)
    elif row.kind == "default":
        _cli(["run", *exact, *device, "--tier", tier, "--out", str(out / "runs")],
             out / f"{tag}.run.json", where)
    else:
        _cli(["run", "reference", "--only", row.patch, *sets, *exact, *device, "--tier", tier,
              "--out", str(out / "runs")], out / f"{tag}.run.json", where)


def _kept(dirs: list[Path], name: str) -> dict[str, tuple[dict[str, Any] | None, str]]:
    """Per device: the kept result `name` from the first of `dirs` that has it on that device,
    and that folder's name."""
    found: dict[str, tuple[dict[str, Any] | None, str]] = {}
    for d in dirs:
        if (d / name).exists():
            doc = json.loads((d / name).read_text())
            where = d.name if d.parent.name == "results" else f"{d.parent.name}/{d.name}"
            found.setdefault(doc.get("device") or "cpu (unrecorded)", (doc.get("result"), where))
    return found


def _drift(v: dict[str, Any]) -> str:
    d = v.get("drift") or {}
    cand = d.get("candidate") or {}
    kl = "" if cand.get("kl_mean") is None else f"KL {cand['kl_mean']:.3g}"
    if d.get("multiple") is not None:  # the null model was measured (probe/null.py)
        return f"×{d['multiple']:.3g} ({kl})"
    return kl or "-"


def _lost(v: dict[str, Any]) -> str:
    o = v.get("overall") or {}
    return "-" if o.get("n") is None else f"{o['b']} / {o['n']} (gained {o['c']})"


def _bisect(b: dict[str, Any] | None) -> str:
    if b is None:
        return "not run"
    culprits = b.get("culprits")
    # trials measured here (a trial answered from the ledger has another source)
    trials = len({t.get("step") for t in b.get("trials") or [] if t.get("source") == "run"})
    named = ", ".join(culprits) if culprits else "none"
    verdict = (b.get("remedy") or {}).get("verdict")
    # One round: the bad end without the culprits passed, so nothing is left to bisect; a
    # remedy that failed twice asks for a second round (another culprit remains).
    tail = {"passes": ", one round, remedy passes", "fails": ", remedy fails: a second round",
            None: ""}.get(verdict, f", remedy {verdict}")
    return f"{b.get('status')}: {named} ({trials} trials{tail})"


def _seen(v: dict[str, Any]) -> str:
    """Where the probe saw the answers lost: per condition (arm@level), the families' counts,
    largest first (`warm@16: needle 11, copy 11`); '-' where none was lost."""
    by: dict[str, dict[str, int]] = {}
    for cell in v.get("cells") or []:
        if cell.get("b"):
            where = by.setdefault(f"{cell['arm']}@{cell.get('concurrency', 1)}", {})
            family = cell["cell"].split("/", 1)[0]
            where[family] = where.get(family, 0) + cell["b"]
    parts = sorted(by.items(), key=lambda kv: -sum(kv[1].values()))
    return "; ".join(f"{cond}: " + ", ".join(f"{f} {n}" for f, n in
                                             sorted(fams.items(), key=lambda kv: -kv[1]))
                     for cond, fams in parts) or "-"


def table(dirs: list[Path], precisions: list[str], rows: tuple[Row, ...]) -> str:
    """One line per row, precision and device, from the first of `dirs` holding each result on
    that device (the last columns name the folders the run and the bisect came from)."""
    lines = ["| change | kind | precision | device | drift | answers lost | lost where | `run` "
             "| default `bisect` names | kept in |",
             "| --- | --- | --- | --- | ---: | ---: | --- | --- | --- | --- |"]
    for row in rows:
        for precision in precisions:
            runs = _kept(dirs, f"{row.key}.{precision}.run.json")
            if not runs:
                lines.append(f"| {row.label} | {row.kind} | {precision} | | not measured "
                             "| | | | | |")
                continue
            bisects = _kept(dirs, f"{row.key}.{precision}.bisect.json")
            for device, (v, at) in runs.items():
                b, b_at = bisects.get(device, (None, ""))
                bis = "-" if row.kind in ("harmless", "default") else _bisect(b)
                kept = at if b_at in ("", at) else f"{at}; bisect {b_at}"
                if v is None:
                    lines.append(f"| {row.label} | {row.kind} | {precision} | {device} | no "
                                 f"result (see its JSON) | | | | {bis} | {kept} |")
                    continue
                lines.append(f"| {row.label} | {row.kind} | {precision} | {device} | {_drift(v)} "
                             f"| {_lost(v)} | {_seen(v)} | {v.get('verdict')} | {bis} | {kept} |")
    return "\n".join(lines)


def _measure_all(jobs: list[tuple[Row, str, str]], workers: int, seed: bool, one) -> None:
    """Every job, `workers` at once. Every row of one precision has the same good end (the
    reference with no patch: one fingerprint), whose baseline `run` caches: the first row runs
    before the others, so they read its baseline instead of all measuring it at once. Bisects
    start beside it."""
    cached = [j for j in jobs if j[2] == "run"]
    seeds = {j[1]: j for j in reversed(cached)} if seed else {}  # each precision's first
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        first = [pool.submit(one, j) for j in seeds.values()]
        rest = [pool.submit(one, j) for j in jobs if j not in cached]
        for f in first:
            f.result()
        rest += [pool.submit(one, j) for j in cached if j not in seeds.values()]
        for f in rest:
            f.result()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", nargs="+", default=["deployment", "exact"],
                    choices=["deployment", "exact"])
    ap.add_argument("--rows", nargs="*",
                    help="only these row labels (none: no `run` row, e.g. only --bisect-rows)")
    ap.add_argument("--tier", default="smoke")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                    help="every engine's device (the profiles' own is auto)")
    ap.add_argument("--jobs", type=int, default=1, help="rows measured at once")
    ap.add_argument("--bisect", action="store_true", help="also bisect every fault (slow)")
    ap.add_argument("--bisect-rows", nargs="+", default=(),
                    help="bisect these faults (listed in --rows or not)")
    ap.add_argument("--no-seed", action="store_true",
                    help="the shared good end's baseline is already cached (carried in): start "
                         "every row at once instead of the first alone")
    ap.add_argument("--commit", help="the commit measured (default: $DSV4BISECT_COMMIT, git)")
    ap.add_argument("--out", type=Path, default=Path("runs/verdict-table"))
    ap.add_argument("--from", dest="from_dirs", type=Path, nargs="+",
                    help="only print the table from JSON kept in these directories (the first "
                         "that holds a result wins, per device)")
    a = ap.parse_args()
    labels = {r.label for r in ROWS}
    unknown = [x for x in [*(a.rows or ()), *a.bisect_rows] if x not in labels]
    if unknown:
        sys.exit(f"error: unknown row {unknown[0]!r}\nhint: rows are {sorted(labels)}")
    rows = tuple(r for r in ROWS if a.rows is None or r.label in a.rows)
    if a.from_dirs is None:
        a.out.mkdir(parents=True, exist_ok=True)
        where = Where(a.device, _commit(a.commit))
        jobs = [(row, precision, "run") for row in rows for precision in a.precision]
        # the bisects first: they are the long ones (longest first keeps the pool busy)
        # --bisect-rows names its faults whether or not --rows lists them, so one call can
        # bisect a fault without measuring its `run` row again
        jobs[:0] = [(row, precision, "bisect") for row in ROWS for precision in a.precision
                    if row.kind == "fault"
                    and ((a.bisect and row in rows) or row.label in a.bisect_rows)]
        _measure_all(jobs, a.jobs, not a.no_seed, lambda j: measure(j[0], j[1], a.tier, a.out, j[2], where))
    print(table(a.from_dirs or [a.out], a.precision, rows))


if __name__ == "__main__":
    main()
