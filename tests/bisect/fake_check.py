"""A `--test-cmd` for the tests: exits 1 when every culprit is in DSV4BISECT_PATCHES.

usage: fake_check.py LOG CULPRITS   (sleeps FAKE_CHECK_DELAY seconds, default 0)
CULPRITS: `a,b` fails when a and b are both on; `a|b` when either is (independent culprits).
Appends `start <patches> <block>` before and `end <patches> <block> <good|bad>` after a delay,
so a test can count invocations and kill the bisect while a trial is running.
FAKE_CHECK_CANNOT=NAME:N: exits 125 (cannot test) where NAME is on with fewer than N patches
(as if its engine were gone: every trial that needs it, the bad end of N patches aside).
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    log, groups = sys.argv[1], [[c for c in g.split(",") if c] for g in sys.argv[2].split("|")]
    delay = float(os.environ.get("FAKE_CHECK_DELAY", "0"))
    patches = os.environ["DSV4BISECT_PATCHES"]
    block = os.environ["DSV4BISECT_SEED_BLOCK"]
    names = {item.split(":")[0] for item in patches.split(",") if item}
    with open(log, "a") as f:
        f.write(f"start {patches or '-'} {block}\n")
    time.sleep(delay)
    cannot, _, n = os.environ.get("FAKE_CHECK_CANNOT", "").partition(":")
    if cannot in names and len(names) < int(n or 0):
        with open(log, "a") as f:
            f.write(f"end {patches or '-'} {block} cannot\n")
        return 125
    bad = any(all(c in names for c in group) for group in groups)
    with open(log, "a") as f:
        f.write(f"end {patches or '-'} {block} {'bad' if bad else 'good'}\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
