"""Benchmark: the noise-aware search against ddmin and plain binary splitting.

Not collected by pytest (the file name does not start with `test_`). Run:

    python tests/benchmarks/bench_search.py                 # the full table (tens of minutes)
    python tests/benchmarks/bench_search.py --quick         # n=6 and n=32 only, fewer runs
    python tests/benchmarks/bench_search.py --n 32 --noise none,10 --jobs 2

Every single culprit and every interacting pair (sampled with a fixed seed when there are more
than --pairs), under simulated probes that flip outcomes at the stated rates (the search is
told the rates; the baselines cannot use them). Trials counted: every probe run after the two
end checks, the minimality check included (the baselines do not check the ends at all). The
search runs with its defaults: confidence 0.95, half the prior on singles, half on pairs.
The bound is log2(number of culprit sets of that size) / (bits per trial of the noisy probe).
Algorithm `priced`: the search with the priced design at equal prices (what `bisect
--test-cmd` runs: the remedy check's configuration credited, and the bad end checked by the
first FAIL rather than run first: docs/bisect.md, "Both ends first"), counted the same way:
every call but two, so its rows compare whole bisects with the unpriced ones.
`--seed-set K` moves every run to another block of seeds (K = 0: the documented table).
`--whole` also counts the remedy check's own trials after a `found` (remedy.py: the bad end
without the culprits, unless the search tested it): the whole bisect's calls after the ends.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dsv4bisect.bisect import remedy
from dsv4bisect.bisect.plan.simulate import oracle_outcome
from dsv4bisect.bisect.search.design import Noise, information_bound
from dsv4bisect.bisect.search.pricing import StepCosts
from dsv4bisect.bisect.search.search import Search
from dsv4bisect.probe import verdict as V

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bisect"))
from simulated import simulate  # noqa: E402 - tests/bisect/simulated.py

NOISES: dict[str, Noise] = {
    "none": Noise(),
    "5": Noise(0.05, 0.05),
    "10": Noise(0.1, 0.1),
    "20": Noise(0.2, 0.2),
    "onesided": Noise(0.0, 0.5),  # a bad configuration passes half the time
}
NOISE_LABEL = {
    "none": "none",
    "5": "5 % two-sided",
    "10": "10 % two-sided",
    "20": "20 % two-sided",
    "onesided": "bad passes 50 %",
}

Test = Callable[[frozenset[str]], bool]  # True = the configuration fails


# -- baselines ---------------------------------------------------------------------------------
def ddmin(items: Sequence[str], fails: Test) -> frozenset[str]:
    """Zeller & Hildebrandt's ddmin with an outcome cache; assumes the full set fails."""
    current, n = list(items), 2
    while len(current) >= 2:
        chunks = [current[i * len(current) // n : (i + 1) * len(current) // n] for i in range(n)]
        chunks = [c for c in chunks if c]
        reduced = False
        for chunk in chunks:
            if fails(frozenset(chunk)):
                current, n, reduced = chunk, 2, True
                break
        if not reduced:
            for chunk in chunks:
                complement = [x for x in current if x not in chunk]
                if fails(frozenset(complement)):
                    current, n, reduced = complement, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    return frozenset(current)


def binary_split(items: Sequence[str], fails: Test) -> frozenset[str]:
    """Plain binary splitting: test the left half; go left if it fails, else right."""
    current = list(items)
    while len(current) > 1:
        left = current[: len(current) // 2]
        current = left if fails(frozenset(left)) else current[len(current) // 2 :]
    return frozenset(current)


def run_baseline(
    algorithm: str, names: Sequence[str], culprit: frozenset[str], noise: Noise, seed: int
) -> tuple[int, bool]:
    rng = random.Random(seed)
    cache: dict[frozenset[str], bool] = {}

    def fails(subset: frozenset[str]) -> bool:
        if subset not in cache:  # a deterministic tool never re-runs a configuration
            cache[subset] = oracle_outcome(subset, culprit, noise, rng) == V.FAIL
        return cache[subset]

    found = (ddmin if algorithm == "ddmin" else binary_split)(names, fails)
    return len(cache), found == culprit


def run_search(
    names: Sequence[str], culprit: frozenset[str], noise: Noise, seed: int,
    priced: bool = False, whole: bool = False,
) -> tuple[int, bool]:
    search = Search(names, noise=noise, max_trials=400, costs=StepCosts() if priced else None)
    rng = random.Random(seed)
    run = simulate(search, culprit, noise, rng)
    extra = 0
    if whole and run.result.culprits:
        subset = remedy.remedy_subset(names, run.result.culprits)
        outcomes = remedy.prior_outcomes(search.records, subset)
        while subset and remedy.needs_more(outcomes, extra):
            outcomes.append(oracle_outcome(subset, culprit, noise, rng))
            extra += 1
    return run.trials - 2 + extra, run.correct


# -- the table ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    n: int
    noise: str
    kind: str
    algorithm: str
    counts: tuple[int, ...]
    correct: float
    bound: float

    def markdown(self) -> str:
        c = sorted(self.counts)
        p90 = c[min(len(c) - 1, math.ceil(0.9 * len(c)) - 1)]
        return (
            f"| {self.n} | {NOISE_LABEL[self.noise]} | {self.kind} | {self.algorithm} | "
            f"{len(c)} | {statistics.mean(c):.2f} | {p90} | {c[-1]} | "
            f"{100 * self.correct:.1f} | {self.bound:.1f} |"
        )


def cases(n: int, kind: str, pairs: int, runs: int, noisy: bool) -> list[tuple[int, ...]]:
    base = (
        [(i,) for i in range(n)] if kind == "single" else list(itertools.combinations(range(n), 2))
    )
    if kind == "pair" and len(base) > pairs:
        base = random.Random(n).sample(base, pairs)
    if not noisy:
        return base
    return [base[i % len(base)] for i in range(max(runs, len(base)))]


def _one(job: tuple[str, int, tuple[int, ...], str, int, bool]) -> tuple[int, bool]:
    algorithm, n, culprit_idx, noise_key, seed, whole = job
    names = [f"p{i:02d}" for i in range(n)]
    culprit = frozenset(names[i] for i in culprit_idx)
    if algorithm in ("search", "priced"):
        return run_search(names, culprit, NOISES[noise_key], seed, algorithm == "priced", whole)
    return run_baseline(algorithm, names, culprit, NOISES[noise_key], seed)


def row(
    pool: ProcessPoolExecutor | None,
    algorithm: str,
    n: int,
    noise_key: str,
    kind: str,
    pairs: int,
    runs: int,
    seed_set: int = 0,
    whole: bool = False,
) -> Row:
    noise = NOISES[noise_key]
    todo = [
        (algorithm, n, c, noise_key, 1000 * n + i + 1_000_000 * seed_set, whole)
        for i, c in enumerate(cases(n, kind, pairs, runs, noise != Noise()))
    ]
    results = list(pool.map(_one, todo, chunksize=4) if pool else map(_one, todo))
    return Row(
        n,
        noise_key,
        kind,
        algorithm,
        tuple(r[0] for r in results),
        sum(r[1] for r in results) / len(results),
        information_bound(n, 1 if kind == "single" else 2, noise),
    )


def decision_time(n: int) -> float:
    """Slowest single `next()` of a noisy pair search with n candidates, in seconds."""
    names = [f"p{i:02d}" for i in range(n)]
    search, rng, worst = Search(names, noise=Noise(0.1, 0.1)), random.Random(0), 0.0
    culprit = frozenset(names[:2])
    while True:
        start = time.perf_counter()
        proposals = search.next()
        worst = max(worst, time.perf_counter() - start)
        if not proposals:
            return worst
        for subset in proposals:
            search.record(subset, oracle_outcome(subset, culprit, Noise(0.1, 0.1), rng))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default="6,16,32,64")
    ap.add_argument("--noise", default=",".join(NOISES))
    ap.add_argument("--kinds", default="single,pair")
    ap.add_argument("--algorithms", default="search,ddmin,binary")
    ap.add_argument("--runs", type=int, default=200, help="runs per noisy row (at least)")
    ap.add_argument("--pairs", type=int, default=120, help="pairs sampled when there are more")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="n=6,32; 64 runs per noisy row")
    ap.add_argument("--seed-set", type=int, default=0, help="another block of seeds")
    ap.add_argument("--whole", action="store_true", help="count the remedy check's trials")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.runs, args.pairs = "6,32", 64, 48
    print("| n | noise | culprit | algorithm | runs | mean | p90 | max | correct % | bound |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    started = time.time()
    pool = ProcessPoolExecutor(args.jobs) if args.jobs > 1 else None
    for n, noise_key, kind, algorithm in itertools.product(
        [int(x) for x in args.n.split(",")],
        args.noise.split(","),
        args.kinds.split(","),
        args.algorithms.split(","),
    ):
        print(
            row(pool, algorithm, n, noise_key, kind, args.pairs, args.runs,
                args.seed_set, args.whole).markdown(), flush=True
        )
    if pool:
        pool.shutdown()
    print(
        f"\nslowest next() at n=64 with pairs (2080 culprit sets + 3 catch-alls): "
        f"{decision_time(64) * 1000:.0f} ms; table took {time.time() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
