"""The genie's floor on one node at the trial probe's own error rate (bisect/plan/exact_floor.py
`genie_floors`, docs/performance.md issue 42 Parts 10 and 11), computed by genie_floor.c: the same
recursion over the same states, which the Python table needs hours for on a profile of six
candidates (`dsv4-flash-tp8-latest-all`).

    python tests/benchmarks/genie_floor.py dsv4-flash-tp8-latest-all [--prices 16000 8000]
        [--share 0.06] [--launch 600] [--trial-rate 0.01] [--check]

Builds the plan's bisect as `plan_what_if.py` does (`dsv4bisect bisect PROFILE --plan
--executor ray --parallel 4`, look 1 at `--share`, the bisect's own by default), compiles the
program with the system's C compiler (`cc -O2`) into a temporary folder and runs
`exact_floor.genie_floors` with it as the genie's table (`c_solver`: each price's problem and
the candidates' symmetry written on its stdin). Prints, per price on a wrong name, the floor
(the ends + the genie's optimum - miss x price), and the best of them. `--check` also runs the Python table on the same problem
and stops with an error where the two differ (for problems the Python table finishes).
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from dsv4bisect.bisect.end_looks import look1_share
from dsv4bisect.bisect.plan.exact_floor import (
    GENIE_PRICES,
    _genie_value,
    _Problem,
    _Symmetry,
    genie_floors,
)
from dsv4bisect.bisect.plan.parallel_plan import floor_run
from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.probe.sequential import TRIAL_ERROR_RATES

SOURCE = Path(__file__).with_name("genie_floor.c")
MAX_SETS = 32  # a belief's masks are 32-bit words there (seven candidates, sets of two)


def problem_text(problem: _Problem, symmetry: _Symmetry | None, eps: float, price: float) -> str:
    """The problem as genie_floor.c reads it (its header comment)."""
    c = problem.costs
    n_states = problem.all + 1
    header = (f"{len(problem.sets)} {n_states} {eps!r} {price!r} {c.switch_s!r} "
              f"{c.launch_s!r} {int(c.hot)} {problem.good_s!r} {problem.bad_s!r}")
    lines = [header,
             " ".join(repr(p) for p in problem.prior),
             f"{len(problem.starts)} " + " ".join(str(s) for s in problem.starts)]
    for members in problem.sets:  # the remedy check: the bad end without the set
        rest = problem.all & ~members
        lines.append(f"{int(rest != 0)} {rest & problem.load} {problem._fails(rest)}")
    lines.append(str(len(problem.tests)))
    lines += [f"{subset & problem.load} {fails} {remedy_of}"
              for subset, fails, remedy_of in problem.tests]
    perms = list(zip(symmetry.taus, symmetry.states, strict=True)) if symmetry else []
    lines.append(str(len(perms)))
    lines += [" ".join(map(str, tau)) + " " + " ".join(map(str, states))
              for tau, states in perms]
    return "\n".join(lines) + "\n"


def compile_program(folder: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("error: no C compiler on PATH\nhint: install gcc (the genie's table is C)")
    binary = folder / "genie_floor"
    # IEEE arithmetic as Python's (no fused multiply-add): the same sums, so the same ties
    subprocess.run([cc, "-O2", "-ffp-contract=off", "-o", str(binary), str(SOURCE), "-lm"],
                   check=True)
    return binary


def run_program(binary: Path, text: str) -> tuple[float, int]:
    out = subprocess.run([str(binary)], input=text, capture_output=True, text=True, check=True)
    _, value, _, states = out.stdout.split()
    return float(value), int(states)


def c_solver(binary: Path, seconds: list[float] | None = None, check: bool = False):
    """The genie's table by the compiled program, as `exact_floor.genie_floors` calls it;
    `seconds` gets each run's time; `check`: the Python table too, an error where they differ."""
    def solve(problem: _Problem, price: float, eps: float, symmetry: _Symmetry | None
              ) -> tuple[float, int]:
        if len(problem.sets) > MAX_SETS:
            raise ValueError(f"{len(problem.sets)} culprit sets: genie_floor.c holds {MAX_SETS}")
        start = time.monotonic()
        value, states = run_program(binary, problem_text(problem, symmetry, eps, price))
        if seconds is not None:
            seconds.append(time.monotonic() - start)
        if check:
            sys.setrecursionlimit(max(sys.getrecursionlimit(), 100_000))
            mine, _ = _genie_value(problem, price, eps, symmetry)
            if not math.isclose(mine, value, rel_tol=1e-9, abs_tol=1e-6):
                sys.exit(f"error: the C table gives {value!r}, the Python table {mine!r}")
        return value, states
    return solve


def main() -> None:
    # plan_what_if imports this module: its builder of the plan's bisect comes in here
    from plan_what_if import at_share, the_plan

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("profile")
    ap.add_argument("--prices", type=float, nargs="+", default=list(GENIE_PRICES),
                    help="seconds on a wrong name (any gives a floor; the best is kept)")
    ap.add_argument("--share", type=float, help="look 1's share (default: the bisect's own)")
    ap.add_argument("--launch", type=float, help="seconds a launch (default: the plan's)")
    ap.add_argument("--trial-rate", type=float,
                    help="the trial probe's error rate, either way (default: the plan's)")
    ap.add_argument("--check", action="store_true", help="also the Python table (slow)")
    args = ap.parse_args()
    plan, prep = the_plan(args.profile)
    share = args.share or look1_share(prep.engine.spec)
    rates = (args.trial_rate, args.trial_rate) if args.trial_rate else TRIAL_ERROR_RATES
    cfg = at_share(plan, prep.engine.spec, share, prep.question.load_time, Noise(*rates))
    if args.launch is not None:
        cfg = replace(cfg, costs=replace(cfg.costs, launch_s=args.launch))
    seconds: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        solve = c_solver(compile_program(Path(folder)), seconds, args.check)
        rows = genie_floors(cfg, prices=tuple(args.prices), solve=solve)
    c = cfg.costs
    print(f"{args.profile}: launch {c.launch_s:.0f} s, switch {c.switch_s:.0f} s, look 1 at "
          f"{share:g}, trial errors {cfg.trial_noise.false_fail:g} either way; the ends "
          f"{floor_run(cfg, 1, frozenset(cfg.candidates)):.0f} s")
    for (price, floor, states), took in zip(rows, seconds, strict=True):
        print(f"  price {price:.0f} s on a wrong name: floor {floor:.0f} s at P(correct) >= 0.99 "
              f"({states} states, {took:.0f} s)")
    price, floor, _ = max(rows, key=lambda row: row[1])
    print(f"floor at the trial probe's error rate, 1 node: {floor:.0f} s (price {price:.0f} s)")


if __name__ == "__main__":
    main()
