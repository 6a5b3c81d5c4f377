"""Fault injection around the real embedded server, for `kind: command` test profiles.

    python fault_server.py [--when PATCH] (--crash-at-start | --die-after N |
                                          --lose-port-once MARKER |
                                          --fill-disk-after N FILE) -- SERVE_ARGS...

When DSV4BISECT_PATCHES does not name PATCH, this execs `python -m dsv4bisect serve SERVE_ARGS`
(the real server, nothing changed). When it does (or when there is no `--when`):
- `--crash-at-start`: prints a message and exits 3 before serving (a patch that breaks startup);
- `--die-after N`: runs the real server as a child, echoes its log, and after it has answered N
  probe requests (chat completions or /generate) kills it and exits 137 (an engine that dies
  mid-probe, every launch);
- `--lose-port-once MARKER`: the first launch (MARKER absent: it is created) says its port is in
  use and exits 125, as `dsv4bisect serve` does when another process took the port; later
  launches serve;
- `--fill-disk-after N FILE`: runs the real server as a child, and once it has answered N probe
  requests writes zeros to FILE until its file system is full (a disk that fills up mid-run),
  then keeps serving.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

PROBE_REQUESTS = ("POST /v1/chat/completions", "POST /generate")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--when")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--crash-at-start", action="store_true")
    mode.add_argument("--die-after", type=int)
    mode.add_argument("--lose-port-once")
    mode.add_argument("--fill-disk-after", nargs=2, metavar=("N", "FILE"))
    opts, serve_args = parser.parse_known_args()
    serve_args = [a for a in serve_args if a != "--"]
    patches = [p.split(":")[0] for p in os.environ.get("DSV4BISECT_PATCHES", "").split(",") if p]
    argv = [sys.executable, "-m", "dsv4bisect", "serve", *serve_args]
    if opts.when is not None and opts.when not in patches:
        os.execv(sys.executable, argv)
    if opts.lose_port_once:
        marker = Path(opts.lose_port_once)
        if marker.exists():
            os.execv(sys.executable, argv)
        marker.write_text("lost once\n")
        print("error: port is already in use (fault_server: simulated lost port)", flush=True)
        return 125
    if opts.crash_at_start:
        print(f"fault_server: simulated crash at start: `{opts.when}` is on", flush=True)
        return 3
    if opts.fill_disk_after:
        return _fill_after(argv, int(opts.fill_disk_after[0]), Path(opts.fill_disk_after[1]))
    return _die_after(argv, opts.die_after, opts.when)


def _fill_after(argv: list[str], limit: int, filler: Path) -> int:
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert child.stdout is not None
    served, full = 0, False
    for line in child.stdout:
        try:
            sys.stdout.write(line)
            sys.stdout.flush()
        except OSError:
            pass  # the log is on the disk we filled
        served += any(marker in line for marker in PROBE_REQUESTS)
        if served >= limit and not full:
            full = True
            try:
                with open(filler, "wb") as f:
                    while True:
                        f.write(b"\0" * (1 << 20))
                        f.flush()
            except OSError:
                pass  # ENOSPC: the file system is full now
    return child.wait()


def _die_after(argv: list[str], limit: int, patch: str) -> int:
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert child.stdout is not None
    served = 0
    for line in child.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        served += any(marker in line for marker in PROBE_REQUESTS)
        if served >= limit:
            child.kill()
            child.wait()
            print(f"fault_server: killed the engine after {served} probe requests "
                  f"(`{patch}` is on)", flush=True)
            return 137
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
