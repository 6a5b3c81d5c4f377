"""A probe run's requests: which (`tasks_of`: every case under every arm and concurrency
level the spec asks for) and in what order a level sends them (`submission_order`). Pure; the
runner (probe/runner.py) sends them, the shards (probe/shards.py) split them, and the sequential
trial probe replays them under the same conditions (probe/sequential.py)."""

from __future__ import annotations

import hashlib
import random

from dsv4bisect.probe.grid import Case
from dsv4bisect.probe.spec import ProbeSpec

Task = tuple[Case, str, int]  # case, arm, concurrency level


def tasks_of(spec: ProbeSpec, cases: list[Case]) -> list[Task]:
    """Every request of a run, level by level (the thinking arm and drift at level 1)."""
    accuracy = [c for c in cases if c.family != "drift"]
    tasks: list[Task] = []
    for level in spec.concurrency:
        tasks += [(c, arm, level) for c in accuracy for arm in spec.arms_at(level)
                  if spec.arm_takes(arm, c.family)]
        if level == 1 and spec.thinking:
            tasks += [(c, "think", 1) for c in cases if c.family == "needle"]
    if 1 not in spec.concurrency and spec.thinking:
        tasks += [(c, "think", 1) for c in cases if c.family == "needle"]
    return tasks + [(c, "drift", 1) for c in cases if c.family == "drift"]


def request_keys(spec: ProbeSpec, cases: list[Case]) -> list[tuple[str, str, int]]:
    """Every request of a run as the key that pairs it across runs (probe/run.py `row_key`:
    case, arm, level), in the order `tasks_of` gives them: what merges and looks sort by."""
    return [(c.case_id, arm, level) for c, arm, level in tasks_of(spec, cases)]


def submission_order(spec: ProbeSpec, level: int, n: int) -> list[int]:
    """The order in which a level's n requests are sent: at level 1 the grid's order, above it a
    shuffle fixed by (seed, seed block, level), so the baseline, its repeat and the candidate
    send the same requests in the same order and a comparison stays paired."""
    order = list(range(n))
    if level > 1:
        key = f"order:{spec.seed}:{spec.seed_block}:{level}"
        random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
                      ).shuffle(order)
    return order
