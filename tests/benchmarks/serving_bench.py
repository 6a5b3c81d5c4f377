"""Throughput of `dsv4bisect serve` under concurrency: requests/s and tokens/s at concurrency 1, 4
and 16, and 16 requests sent one after another against the same 16 sent at once.

    python tests/benchmarks/serving_bench.py [--checkpoint embedded] [--precision exact]
        [--requests 16] [--max-tokens 32] [--concurrency 1,4,16] [--threads N]

Starts one `serve` process (`--port 0`), sends distinct chat prompts (the cache is flushed before
each measurement, so every prompt prefills from scratch; greedy, `ignore_eos` so every request
generates `--max-tokens` tokens), and prints one row per concurrency level: wall time,
requests/s, output tokens/s, total (prompt + output) tokens/s, and the server's
`peak_running_requests` and batch counts for that run. The figures go to docs/performance.md with
the machine and its load average (printed at the start and the end).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests


def start(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "dsv4bisect", "serve", "--port", "0", "--device", "cpu",
            "--checkpoint", args.checkpoint, "--precision", args.precision]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # the ready: line is on stderr
        if line.startswith("ready:"):
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, next(w for w in line.split() if w.startswith("http"))
    sys.exit(f"error: serve exited {proc.wait()}")


def prompts(n: int) -> list[str]:
    topics = ["rivers", "prime numbers", "the moon", "bread", "chess", "rain", "violins", "maps"]
    return [f"Write a short note about {topics[i % len(topics)]} (note {i})." for i in range(n)]


def one(url: str, text: str, max_tokens: int) -> dict[str, Any]:
    r = requests.post(f"{url}/v1/chat/completions", timeout=3600, json={
        "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True})
    r.raise_for_status()
    return r.json()["usage"]


def measure(url: str, texts: list[str], concurrency: int, max_tokens: int) -> dict[str, Any]:
    requests.post(f"{url}/flush_cache", timeout=60).raise_for_status()
    before = requests.get(f"{url}/server_info", timeout=60).json()
    tic = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        usages = list(pool.map(lambda t: one(url, t, max_tokens), texts))
    wall = time.perf_counter() - tic
    after = requests.get(f"{url}/server_info", timeout=60).json()
    out = sum(u["completion_tokens"] for u in usages)
    total = sum(u["total_tokens"] for u in usages)
    return {
        "concurrency": concurrency, "requests": len(texts), "wall_s": round(wall, 2),
        "requests_per_s": round(len(texts) / wall, 3), "output_tokens_per_s": round(out / wall, 1),
        "total_tokens_per_s": round(total / wall, 1),
        "peak_running_requests": after["peak_running_requests"],
        "prefill_batches": after["prefill_batches"] - before["prefill_batches"],
        "decode_batches": after["decode_batches"] - before["decode_batches"],
        "cached_tokens": after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="embedded")
    p.add_argument("--precision", default="exact")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    proc, url = start(args)
    try:
        texts = prompts(args.requests)
        one(url, "warm up", 4)  # first-call allocations out of the figures
        for c in (int(x) for x in args.concurrency.split(",")):
            print(json.dumps(measure(url, texts, c, args.max_tokens)), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(f"load average at end: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
