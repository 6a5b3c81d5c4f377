"""What a PD transfer of the embedded engine moves and how long it takes, per request, and what
the PD topology costs a probe.

    python tests/benchmarks/pd_transfer.py [--tier smoke] [--backends mooncake,nixl]
        [--precision deployment] [--monolithic] [--warmup N] [--out DIR] [--json OUT.json]

For each backend: `reference-pd` launched as `dsv4bisect run` launches it (prefill server,
decode server, router; ports chosen free), one probe run of the tier through the router
(`probe.runner.collect`), then every transfer's record from the decode server's log (one
`decode transfer room ...` line per request: bytes of KV, state, aux and framing, the
transfer's milliseconds from first byte to status, and the wait from registering to the first
byte, i.e. the prefill's compute) and the totals of both servers' `/server_info`. Prints the
median and 90th percentile per request and the probe's wall time; `--json` keeps it all.
The same probe against `reference` (the monolithic server, `--monolithic`) gives the
topology's cost; `--warmup N` then times the probe's polluting phase of N requests on each.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.engines.launcher import Launch
from dsv4bisect.probe.client import ProbeClient
from dsv4bisect.probe.runner import collect
from dsv4bisect.probe.spec import tier_spec
from dsv4bisect.probe.warmup import pollute

LINE = re.compile(r"decode transfer room \d+ \((\w+), (\d+) tokens\): kv (\d+) B, state (\d+) B, "
                  r"aux (\d+) B, framing (\d+) B in ([\d.]+) ms(?: after waiting (\d+) ms)?")


def _quantiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"median": statistics.median(values),
            "p90": values[min(len(values) - 1, int(0.9 * len(values)))],
            "max": values[-1]}


def measure(profile: str, sets: tuple[str, ...], tier: str, where: Path,
            warmup: int = 0) -> dict[str, Any]:
    cfg = resolve(profile, Overrides(sets=sets))
    t0 = time.perf_counter()
    with Launch(cfg, where) as launch:
        launched = time.perf_counter() - t0
        t1 = time.perf_counter()
        run = collect(launch.url, tier_spec(tier))
        probe_s = time.perf_counter() - t1
        polluted = {}
        if warmup:  # the polluting phase alone, after the probe (probe/warmup.py)
            client = ProbeClient(launch.url)
            polluted = pollute(client, tier_spec(tier).replace(warmup_requests=warmup),
                               client.describe())
            client.close()
        info = requests.get(launch.url + "/server_info", timeout=60).json()
    out: dict[str, Any] = {"profile": profile, "sets": list(sets), "launch_s": launched,
                           "probe_s": probe_s, "requests": len(run.rows), "warmup": polluted}
    if "decode" not in info:
        return out
    records = []
    for line in (where / "logs" / "decode.log").read_text().splitlines():
        m = LINE.search(line)
        if m:
            records.append({"backend": m.group(1), "tokens": int(m.group(2)),
                            "kv": int(m.group(3)), "state": int(m.group(4)),
                            "aux": int(m.group(5)), "framing": int(m.group(6)),
                            "ms": float(m.group(7)), "wait_ms": float(m.group(8) or 0)})
    total = [r["kv"] + r["state"] + r["aux"] + r["framing"] for r in records]
    out |= {"transfers": len(records),
            "bytes_total": _quantiles(total) if total else None,
            "bytes_kv": _quantiles([r["kv"] for r in records]) if records else None,
            "bytes_state": _quantiles([r["state"] for r in records]) if records else None,
            "transfer_ms": _quantiles([r["ms"] for r in records]) if records else None,
            "wait_ms": _quantiles([r["wait_ms"] for r in records]) if records else None,
            "tokens": _quantiles([r["tokens"] for r in records]) if records else None,
            "prefill_info": {k: v for k, v in info["prefill"][0].items()
                             if k.startswith("pd_")},
            "decode_info": {k: v for k, v in info["decode"][0].items()
                            if k.startswith(("pd_", "state_pool"))}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", default="smoke")
    ap.add_argument("--backends", default="mooncake,nixl")
    ap.add_argument("--precision", default="deployment")
    ap.add_argument("--monolithic", action="store_true", help="also probe `reference`")
    ap.add_argument("--warmup", type=int, default=0,
                    help="then time a polluting phase of this many requests on each server")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="pd-transfer-"))
    results = []
    precision = f"engine.precision={args.precision}"
    for backend in args.backends.split(","):
        sets = (precision, f"engine.pd.transfer_backend={backend}")
        results.append(measure("reference-pd", sets, args.tier, root / backend, args.warmup))
    if args.monolithic:
        results.append(measure("reference", (precision,), args.tier, root / "monolithic",
                               args.warmup))
    for r in results:
        line = f"{r['profile']} {' '.join(r['sets'])}: launch {r['launch_s']:.0f} s, probe " \
               f"{r['probe_s']:.0f} s ({r['requests']} answers)"
        if r.get("transfers"):
            b, t, w = r["bytes_total"], r["transfer_ms"], r["wait_ms"]
            line += (f"; {r['transfers']} transfers, bytes per request median {b['median']:.0f}"
                     f" (p90 {b['p90']:.0f}; kv {r['bytes_kv']['median']:.0f}, state "
                     f"{r['bytes_state']['median']:.0f}), transfer {t['median']:.2f} ms "
                     f"(p90 {t['p90']:.2f}), waiting for the prefill {w['median']:.0f} ms "
                     f"(p90 {w['p90']:.0f}), prompt tokens median {r['tokens']['median']:.0f}")
        if r["warmup"]:
            w = r["warmup"]
            line += (f"; polluting phase {w['requests']:.0f} requests in {w['seconds']:.0f} s "
                     f"({w['seconds'] / w['requests']:.2f} s a request)")
        print(line)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
