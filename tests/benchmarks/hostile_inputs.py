"""Benchmark: the hostile inputs of issue 40 against the real CLI and server — time, peak RSS and
exit code (or HTTP status) of each.

Not collected by pytest (the tests that hold each behaviour: tests/bisect/
test_many_differences.py, tests/plugin/test_hostile_source.py, tests/reference/
test_server_guards.py, tests/reference/test_server_memory.py). Cases:

- configs: `bisect --good-config A --bad-config B --plan` where A and B differ in 64 (the most
  one search weighs), 100, 600 and 3000 environment variables;
- hostile sources: `switches --sglang-src` and `doctor --sglang-src` on a wheel with invalid
  UTF-8, a 200 000-term expression, a 2 GiB zip bomb, and a tree with a 3 GiB .py file (sparse),
  each under a 1 GiB address-space limit (`resource.setrlimit(RLIMIT_AS)`);
- amplifying requests, against one `dsv4bisect serve` (the shipped checkpoint, as the field
  report): a 16 000-token prompt scored with `top_logprobs_num` 512, 64 of them at once, five
  requests of ~1 M log-prob entries at once, and the prefix cache under 500 distinct
  1000-token prompts with a 64 MiB budget, then a flush.

A CLI case's peak RSS is the child's own (`os.wait4`); a server case's is the server's VmHWM
before and after, and its VmRSS. Run (docs/reliability.md records the output):

    python tests/benchmarks/hostile_inputs.py [--skip configs,sources,server] [--prompts 500]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import random
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

GIB = 1 << 30
HOSTILE_FILES = ("sglang/srt/environ.py", "sglang/version.py")


@dataclass
class Row:
    case: str
    result: str  # exit code or HTTP statuses
    seconds: float
    peak_mb: float
    note: str = ""


def run_cli(args: list[str], cwd: Path, limit_as: int | None = None, timeout: float = 900
            ) -> tuple[int, float, float, str]:
    """(exit code, seconds, the child's peak RSS in MB, stderr's last line)."""
    def limit() -> None:
        if limit_as:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    err = cwd / "stderr.txt"
    t0 = time.perf_counter()
    with err.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "dsv4bisect", *args], cwd=cwd,
                                stdout=subprocess.DEVNULL, stderr=log, preexec_fn=limit,
                                env={**os.environ, "COLUMNS": "200"})
    deadline = t0 + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.05)
    seconds = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    lines = err.read_text(errors="replace").strip().splitlines()
    first = next((line for line in lines if line.startswith("error:")), lines[-1] if lines else "")
    return code, seconds, usage.ru_maxrss / 1024, first[:160]


# ---- configs ------------------------------------------------------------------------------------

def configs(folder: Path, counts: list[int]) -> list[Row]:
    rows = []
    for n in counts:
        paths = []
        for end, value in (("a", "0"), ("b", "1")):
            lines = ["schema_version: 1", f"name: diff{n}{end}", "extends: reference",
                     "engine:", "  env:"]
            lines += [f'    DSV4_TEST_KNOB_{i:05d}: "{value}"' for i in range(n)]
            path = folder / f"diff{n}{end}.yaml"
            path.write_text("\n".join(lines) + "\n")
            paths.append(str(path))
        code, s, peak, err = run_cli(["bisect", "--good-config", paths[0], "--bad-config",
                                      paths[1], "--plan"], folder)
        rows.append(Row(f"config bisect --plan, {n} differences", f"exit {code}", s, peak,
                        err if code else "plan printed"))
        print(rows[-1], flush=True)
    return rows


# ---- hostile sources ------------------------------------------------------------------------------

def _wheel(path: Path, write) -> Path:  # noqa: ANN001 - (zip, member name) -> None
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr("sglang/__init__.py", "")
        for name in HOSTILE_FILES:
            write(z, name)
    return path


def _bomb(z: zipfile.ZipFile, name: str) -> None:
    """One member of 2 GiB (`environ.py`, what `switches` reads first); the archive's declared
    size is what both commands refuse, before `doctor` would read `version.py`."""
    if name != HOSTILE_FILES[0]:
        z.writestr(name, "__version__ = '0.5.23'\n")
        return
    with z.open(name, "w", force_zip64=True) as f:
        chunk = b"#" * (8 << 20)
        for _ in range(256):  # 2 GiB
            f.write(chunk)


def sources(folder: Path) -> list[Row]:
    deep = b"x = " + b"+".join([b"1"] * 200_000) + b"\n"
    cases = {
        "invalid UTF-8 (wheel)": lambda: _wheel(folder / "utf8.whl",
                                                lambda z, n: z.writestr(n, b"X = '\xe9'\n")),
        "200 000-term expression (wheel)": lambda: _wheel(folder / "deep.whl",
                                                          lambda z, n: z.writestr(n, deep)),
        "2 GiB zip bomb (wheel)": lambda: _wheel(folder / "bomb.whl", _bomb),
        "3 GiB .py file (tree, sparse)": lambda: _sparse_tree(folder / "tree"),
    }
    rows = []
    for case, make in cases.items():
        t0 = time.perf_counter()
        src = make()
        built = time.perf_counter() - t0
        for command in ("switches", "doctor"):
            code, s, peak, err = run_cli([command, "--sglang-src", str(src)], folder,
                                         limit_as=GIB)
            rows.append(Row(f"{command} --sglang-src: {case}", f"exit {code}", s, peak,
                            f"{err} (input built in {built:.0f} s)"))
            print(rows[-1], flush=True)
    return rows


def _sparse_tree(root: Path) -> Path:
    for name in ("sglang/__init__.py", *HOSTILE_FILES):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        with (root / name).open("wb") as f:
            if not name.endswith("__init__.py"):
                f.truncate(3 * GIB)
    return root


# ---- the server --------------------------------------------------------------------------------

class Server:
    def __init__(self, folder: Path, *args: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (folder / f"serve-{self.port}.log").open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dsv4bisect", "serve", "--port", str(self.port),
             "--device", "cpu", *args], stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if urllib.request.urlopen(f"{self.url}/health", timeout=5).status == 200:
                    return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("server did not start")

    def status_mb(self, field: str) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
        return 0.0

    def post(self, path: str, body: object) -> tuple[int, int]:
        """(status, reply bytes)."""
        req = urllib.request.Request(f"{self.url}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=1800) as r:
                return r.status, len(r.read())
        except urllib.error.HTTPError as e:
            return e.code, len(e.read())

    def info(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/server_info", timeout=60) as r:
            return json.load(r)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def _ids(n: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(3, 250) for _ in range(n)]


def _scored(n: int, top: int, seed: int) -> dict:
    return {"input_ids": _ids(n, seed), "return_logprob": True, "logprob_start_len": 0,
            "top_logprobs_num": top, "sampling_params": {"max_new_tokens": 1}}


def _timed(server: Server, case: str, bodies: list[dict]) -> Row:
    hwm0, t0 = server.status_mb("VmHWM"), time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(pool.map(lambda b: server.post("/generate", b), bodies))
    seconds = time.perf_counter() - t0
    codes: dict[int, int] = {}
    for code, _ in replies:
        codes[code] = codes.get(code, 0) + 1
    result = ", ".join(f"{n} × {c}" for c, n in sorted(codes.items()))
    biggest = max(size for _, size in replies)
    return Row(case, result, seconds, server.status_mb("VmHWM"),
               f"largest reply {biggest / 1e6:.2f} MB; server peak RSS before {hwm0:.0f} MB")


def server_cases(folder: Path, prompts: int) -> list[Row]:
    rows = []
    server = Server(folder, "--checkpoint", "embedded", "--prefix-cache-budget-mib", "64")
    try:
        rows.append(_timed(server, "/generate 16 000 prompt tokens scored, top_logprobs_num 512",
                           [_scored(16_000, 512, 1)]))
        print(rows[-1], flush=True)
        rows.append(_timed(server, "the same, 64 at once", [_scored(16_000, 512, s)
                                                            for s in range(64)]))
        print(rows[-1], flush=True)
        rows.append(_timed(server, "5 at once: 2000 positions scored, top_logprobs_num 490 "
                                   "(0.98 M entries each)",
                           [_scored(2000, 490, s) for s in range(5)]))
        print(rows[-1], flush=True)
        server.post("/flush_cache", {})
        rows += prefix_cache(server, prompts)
    finally:
        server.stop()
    return rows


def prefix_cache(server: Server, prompts: int) -> list[Row]:
    """500 distinct 1000-token prompts (2 new tokens each) under a 64 MiB budget; the RSS
    once idle after each hundred, then after a flush."""
    post = lambda ids: server.post("/generate", {  # noqa: E731
        "input_ids": ids, "sampling_params": {"max_new_tokens": 2}})
    post(_ids(1000, 10_000))  # the allocator's working set for one prefill
    urllib.request.urlopen(urllib.request.Request(f"{server.url}/flush_cache", method="POST"))
    time.sleep(1)
    baseline = server.status_mb("VmRSS")
    rows, t0 = [], time.perf_counter()
    samples = []
    for i in range(prompts):
        post(_ids(1000, i))
        time.sleep(0.05)
        samples.append(server.status_mb("VmRSS"))
        if (i + 1) % 100 == 0:
            info = server.info()
            rows.append(Row(f"prefix cache: {i + 1} distinct 1000-token prompts, budget 64 MiB",
                            f"cache {info['prefix_cache_bytes'] / 2**20:.1f} MiB, "
                            f"{info['prefix_cache_entries']} snapshots",
                            time.perf_counter() - t0, samples[-1],
                            f"RSS max of the last 100: {max(samples[-100:]):.0f} MB; baseline "
                            f"(after one request and a flush) {baseline:.0f} MB"))
            print(rows[-1], flush=True)
    urllib.request.urlopen(urllib.request.Request(f"{server.url}/flush_cache", method="POST"))
    time.sleep(1)
    rows.append(Row("prefix cache: after POST /flush_cache", "cache 0 MiB", 0.0,
                    server.status_mb("VmRSS"), f"baseline {baseline:.0f} MB"))
    print(rows[-1], flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip", default="", help="comma-separated: configs, sources, server")
    ap.add_argument("--differences", default="64,100,600,3000")
    ap.add_argument("--prompts", type=int, default=500)
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} on {platform.node()}: {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        folder = Path(tmp)
        if "configs" not in skip:
            rows += configs(folder, [int(n) for n in args.differences.split(",")])
        if "sources" not in skip:
            rows += sources(folder)
        if "server" not in skip:
            rows += server_cases(folder, args.prompts)
    print("\n| case | result | time | peak RSS | note |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r.case} | {r.result} | {r.seconds:.1f} s | {r.peak_mb:.0f} MB | {r.note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
