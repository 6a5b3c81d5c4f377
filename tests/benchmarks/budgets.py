"""The wall-clock budgets that used to be asserted inside unit tests, measured here instead (a
unit test that fails only under load is a bug; a budget is a figure to watch, not a pass/fail):

    python tests/benchmarks/budgets.py

Each line: what was timed, its best of 3 runs, and the budget the unit test used to assert.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "hardening")]

from test_bounded_loader import _bomb, _flash_index  # noqa: E402

from dsv4bisect.bisect.plan.simulate import Setup  # noqa: E402
from dsv4bisect.bisect.plan.whole_plan import plan_bisect  # noqa: E402
from dsv4bisect.bisect.search.design import Noise  # noqa: E402
from dsv4bisect.bisect.search.pricing import StepCosts  # noqa: E402
from dsv4bisect.bisect.search.search import Search  # noqa: E402
from dsv4bisect.config.checkpoints import load_weight_map  # noqa: E402
from dsv4bisect.config.yamlsource import load_yaml  # noqa: E402
from dsv4bisect.errors import ConfigError  # noqa: E402
from dsv4bisect.probe import verdict as V  # noqa: E402


def best_of(fn: Callable[[], object], runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def step_at_n64() -> None:
    names = [f"p{i:02d}" for i in range(64)]
    search = Search(names, noise=Noise(0.1, 0.1))
    search.record(frozenset(), V.PASS)
    search.record(frozenset(names), V.FAIL)
    search.next()


def refused(path: Path) -> None:
    try:
        load_yaml(path)
    except ConfigError:
        return
    raise AssertionError(f"{path} was not refused")


def main() -> int:
    rows = [("a search step at n=64 with pairs", step_at_n64, 1.0),
            ("the plan of 6 candidates, 100 simulated bisects (whole_plan.py)",
             lambda: plan_bisect(Setup(tuple("abcdef"), Noise(), Noise(),
                                       StepCosts(launch_s=300, probe_s=100)), compare=False),
             5.0)]
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "flash"
        index.mkdir()
        _flash_index(index)
        rows.append(("a V4-Flash-sized shard index (bounded loader)",
                     lambda: load_weight_map(index), 10.0))
        bomb = Path(tmp) / "bomb.yaml"
        bomb.write_text(_bomb(30))
        rows.append(("a YAML alias bomb refused (bounded loader)", lambda: refused(bomb), 2.0))
        for what, fn, budget in rows:
            took = best_of(fn)
            print(f"{what}: {took:.3f} s (budget {budget:g} s){'' if took < budget else '  OVER'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
