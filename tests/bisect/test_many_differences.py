"""Two configurations that differ in hundreds or thousands of settings (issue 40, item 4): the
search's space is bounded before anything is allocated, and `--good-config/--bad-config`
refuses more candidates than one search weighs with the first round to run (exit 5).

Before: 100 differences planned for minutes, 600 took 2.7 GB, 3000 ended with exit 70 asking
for 101 GiB (`Unable to allocate ... (4501500, 3000)`).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from dsv4bisect.bisect.config_question import config_question
from dsv4bisect.bisect.search.hypotheses import (
    MAX_CANDIDATES,
    MAX_CULPRIT_SETS,
    HypothesisSpace,
    Priors,
    culprit_sets,
)
from dsv4bisect.bisect.search.search import Search
from dsv4bisect.errors import BisectError

GIB = 1 << 30


def names(n: int) -> list[str]:
    return [f"env:KNOB_{i:05d}" for i in range(n)]


def test_the_space_holds_64_candidates_up_to_pairs() -> None:
    assert culprit_sets(MAX_CANDIDATES, 2) == MAX_CULPRIT_SETS == 2080
    space = HypothesisSpace(names(64), 2, Priors())
    assert space.n_sets == 2080
    assert Search(names(64)).next()  # the search proposes its first trials


@pytest.mark.parametrize(("n", "order", "largest"), [(65, 2, 64), (3000, 2, 64), (24, 3, 23)])
def test_a_larger_space_is_refused_before_anything_is_allocated(n: int, order: int,
                                                                largest: int) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(BisectError) as err:
            HypothesisSpace(names(n), order, Priors())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # the names, not a membership matrix (3000: 101 GiB before)
    assert f"{culprit_sets(n, order)} culprit sets" in err.value.message
    assert f"at most {largest} candidates" in err.value.hint
    with pytest.raises(BisectError):  # the search's settings check says the same
        Search(names(n), max_order=order)


def pair(tmp_path: Path, n: int, kernel: int = 0) -> tuple[str, str]:
    """Two profiles on `reference` differing in n variables; the last `kernel` of them are
    named as precision switches (FP8: the tier rule weighs them 4x an unknown name)."""
    paths = []
    for end, value in (("a", "0"), ("b", "1")):
        lines = ["schema_version: 1", f"name: many-{end}", "extends: reference", "engine:",
                 "  env:"]
        lines += [f"    DSV4_{'FP8' if i >= n - kernel else 'TEST'}_KNOB_{i:05d}: \"{value}\""
                  for i in range(n)]
        path = tmp_path / f"many-{end}.yaml"
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths[0], paths[1]


def test_too_many_differences_name_the_first_round(tmp_path: Path) -> None:
    a, b = pair(tmp_path, 100, kernel=10)
    with pytest.raises(BisectError) as err:
        config_question(a, b)
    assert "differ in 100 settings" in err.value.message
    hint = err.value.hint
    first = hint.split("--candidates ", 1)[1].split(";", 1)[0].split(",")
    assert len(first) == MAX_CANDIDATES
    assert {f"env:DSV4_FP8_KNOB_{i:05d}" for i in range(90, 100)} <= set(first)  # likeliest
    assert "the other 36" in hint
    q = config_question(a, b, candidates=",".join(first))  # the round the hint names runs
    assert len(q.candidates) == MAX_CANDIDATES
    assert len([n for n, why in q.left_out if why == "not in --candidates"]) == 36


def test_3000_differences_are_exit_5_within_1_gib(tmp_path: Path) -> None:
    a, b = pair(tmp_path, 3000)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (GIB, GIB))

    proc = subprocess.run(
        [sys.executable, "-m", "dsv4bisect", "bisect", "--good-config", a, "--bad-config", b,
         "--plan"], capture_output=True, text=True, timeout=600, preexec_fn=limited,
        cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert "differ in 3000 settings" in proc.stderr and "hint:" in proc.stderr
    assert "Traceback" not in proc.stderr
