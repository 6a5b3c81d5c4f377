"""Compare two runs of the fast suite test by test, from their JUnit XML files.

    python -m pytest -m "not slow and not gpu" -q -p no:cacheprovider --junitxml=old.xml   # tree A
    python -m pytest -m "not slow and not gpu" -q -p no:cacheprovider --junitxml=new.xml   # tree B
    python tests/benchmarks/suite_compare.py old.xml new.xml

Run both trees at the same time on the same machine (each in its own checkout), so load hits
both alike. The whole-suite wall time mixes two things — the tests both trees have, and the
tests only one has — and this separates them: the common tests' summed time in each tree, the
added and removed tests' time, and where the common tests got slower or faster.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict

Key = tuple[str, str]


def durations(path: str) -> dict[Key, float]:
    """(classname, name) -> seconds (JUnit's time: setup, call and teardown)."""
    return {(tc.get("classname") or "", tc.get("name") or ""): float(tc.get("time") or 0)
            for tc in ET.parse(path).getroot().iter("testcase")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args()
    old, new = durations(args.old), durations(args.new)
    common = sorted(set(old) & set(new))
    t_old, t_new = sum(old[k] for k in common), sum(new[k] for k in common)
    added, removed = set(new) - set(old), set(old) - set(new)
    print(f"old: {len(old)} tests, {sum(old.values()):.0f} s; new: {len(new)} tests, "
          f"{sum(new.values()):.0f} s")
    print(f"common: {len(common)} tests, old {t_old:.0f} s, new {t_new:.0f} s "
          f"({t_new / t_old:.2f}x)" if t_old else "common: none")
    print(f"only in new: {len(added)} tests, {sum(new[k] for k in added):.0f} s; only in old: "
          f"{len(removed)} tests, {sum(old[k] for k in removed):.0f} s")
    by_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for k in common:
        by_module[k[0]][0] += old[k]
        by_module[k[0]][1] += new[k]
    moved = sorted(by_module.items(), key=lambda kv: kv[1][1] - kv[1][0])
    print("common tests by module, largest changes:")
    for name, (o, n) in moved[:args.top] + moved[-args.top:][::-1]:
        print(f"  {n - o:+7.1f} s  {name}  ({o:.0f} -> {n:.0f})")
    heavy = sorted(added, key=lambda k: -new[k])[:args.top]
    print("heaviest tests only in new:")
    for k in heavy:
        print(f"  {new[k]:6.1f} s  {k[0]}::{k[1]}")


if __name__ == "__main__":
    main()
