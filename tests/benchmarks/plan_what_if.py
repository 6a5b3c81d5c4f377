"""Where a bisect's time goes with the ends' two looks at other shares: the plan's own
simulation, look 1 at each `case_share` (bisect/end_looks.py; `look1_share(spec)` is what the
bisect runs), its computed tokens, its world's chance of a look 2 and the trial probe simulated
on its grid, as `--plan` prices them (bisect/plan/costs.py, look_world.py). Share 1 is the full
tier (one look). Also the floor under the other costs (launches, switches, trials) that no look
moves, and, with --confidence or --trial-rates, what the search's stopping confidence or the
trial probe's asked error rates do to P(correct).

    python tests/benchmarks/plan_what_if.py dsv4-flash-tp8-latest-all [--runs 400]
        [--shares 1 0.5 0.25 0.1] [--confidence 0.99] [--trial-rates 0.005 0.005]
        [--after-run] [--good-cached] [--by-class] [--exact] [--noiseless] [--genie]

`--after-run`: the bisect that follows a failing `run` of the profile, whose seed block 0 ends
that run left in the cache (`StepCosts.ends0_cached`, as `--plan` prices them when it finds
both entries: bisect/trials/end_probes.py `run_ends`). `--good-cached`: only block 0's good
end is cached (`StepCosts.good0_cached`, as `--plan` prices it when it finds the baseline).
`--by-class`: the one-node row per class of hidden culprit set (a single culprit or a pair, by
how many of them are load-time), with the fewest launches a bisect can spend on that class under
its rules (`FEWEST_LAUNCHES`). `--exact`: also the exact floor on one node (bisect/plan/
exact_floor.py: the optimum of the same problem with noiseless trials, by dynamic programming, at
P(correct) 1 and at the plan's 0.99; about 90 s for a profile of six candidates, two load-time).
`--noiseless`: the world's verdicts and the search's model without errors (the ends' and the
trials' costs as priced): what the search's choices alone spend over the exact floor.
`--genie`: also the floor on one node at the trial probe's own error rate (exact_floor.py
`noisy_floor`: the genie's bound, the best of `GENIE_PRICES` on a wrong name), by
genie_floor.c (a C compiler needed; about 5 minutes for `latest-all`, 5.1 M states a price).

Builds the bisect as `dsv4bisect bisect PROFILE --plan --executor ray --parallel 4` does
(bisect/setup.py `prepare`: the SGLang defaults, no ledger) and, per share, simulates the
one-node row and the best four-node sharded row on the plan's culprit sets and outcome streams
(`parallel_plan.plan_nodes`'s), and the floor (`floor_run`: the ends at look 1 and one trial of
the culprits), and under each row a floor for any search on one node and on four
(`_any_search_floor`: the ends, the launches the rules need and the trials the information
needs at the trial probe's error rates). At the bisect's own share the rows are the plan's own
(checked against `plan_nodes`).
"""

from __future__ import annotations

import argparse
import math
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from genie_floor import c_solver, compile_program

from dsv4bisect.bisect.end_looks import LOOK1_MAX_SHARE, look1_share
from dsv4bisect.bisect.plan.costs import plan_costs, probe_shape, sequential_from_probe
from dsv4bisect.bisect.plan.exact_floor import exact_floor, noisy_floor
from dsv4bisect.bisect.plan.parallel_plan import _row as node_row
from dsv4bisect.bisect.plan.parallel_plan import floor_run, plan_nodes, sharded_row
from dsv4bisect.bisect.plan.simulate import Setup, common_draws
from dsv4bisect.bisect.rounds import ALONE, TOGETHER
from dsv4bisect.bisect.search.design import Noise, binary_entropy, capacity, entropy
from dsv4bisect.bisect.search.hypotheses import HypothesisSpace, Priors
from dsv4bisect.bisect.session import NODE_PLAN_RUNS, PLAN_RUNS, ask
from dsv4bisect.bisect.setup import BisectRequest, prepare
from dsv4bisect.policy import Executor
from dsv4bisect.probe.sequential import TRIAL_ERROR_RATES


def at_share(plan: Setup, spec, share: float, load_time, trial: Noise) -> Setup:
    """The plan's bisect with look 1 at `share` of each stratum (1: full-tier ends)."""
    look = spec.replace(case_share=share)
    costs = plan_costs("sglang", probe_shape(spec), given={}, load_time=tuple(load_time),
                       hot=True, noise=plan.noise, sequential=sequential_from_probe(look, trial),
                       look1=probe_shape(look))
    return replace(plan, costs=costs.costs, trial_noise=costs.trial_noise, look1=costs.look1)


def the_plan(profile: str):
    """The bisect `dsv4bisect bisect PROFILE --plan --executor ray --parallel 4` plans, and
    its preparation (bisect/setup.py `prepare`: the SGLang defaults, no ledger)."""
    request = BisectRequest(profile=profile, parallel=4, executor=Executor.RAY, plan_only=True)
    prep = prepare(ask(request), request)
    assert prep.engine is not None, "an engine bisect"
    return replace(prep.setup(), confirm=False), prep  # the Ray executor cannot launch fresh


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("profile")
    ap.add_argument("--runs", type=int, default=NODE_PLAN_RUNS)
    ap.add_argument("--shares", type=float, nargs="+",
                    help="look 1's shares (default: 1, 0.5, 0.25, the bisect's own)")
    ap.add_argument("--confidence", type=float, help="the search's stopping confidence")
    ap.add_argument("--trial-rates", type=float, nargs=2, metavar=("FF", "FP"),
                    help="the trial probe's asked error rates (default: the hot runner's)")
    ap.add_argument("--launch", type=float, help="seconds a launch (default: the plan's)")
    ap.add_argument("--pool", type=int,
                    help="engines kept on a node (default: the plan's; 2: one asleep beside it)")
    ap.add_argument("--after-run", action="store_true",
                    help="seed block 0's ends cached by a failing run (StepCosts.ends0_cached)")
    ap.add_argument("--by-class", action="store_true",
                    help="the one-node row per class of culprit set, beside its fewest launches")
    ap.add_argument("--exact", action="store_true",
                    help="the exact floor on one node (noiseless trials, dynamic programming)")
    ap.add_argument("--genie", action="store_true",
                    help="the floor on one node at the trial probe's error rate "
                         "(genie_floor.c: a C compiler, about 5 minutes for latest-all)")
    ap.add_argument("--noiseless", action="store_true",
                    help="verdicts without errors, in the world and in the search's model")
    ap.add_argument("--good-cached", action="store_true",
                    help="seed block 0's good end alone in the baseline cache "
                         "(StepCosts.good0_cached)")
    args = ap.parse_args()
    if args.genie:  # the genie's table in C (genie_floor.c): the Python one takes hours
        folder = tempfile.TemporaryDirectory(prefix="genie-")  # removed at exit
        genie_binary = compile_program(Path(folder.name))
    plan, prep = the_plan(args.profile)
    asked = (args.confidence or args.trial_rates or args.launch is not None or args.pool
             or args.after_run or args.good_cached or args.noiseless)
    own_share = look1_share(prep.engine.spec)
    args.shares = args.shares or sorted({1.0, 0.5, LOOK1_MAX_SHARE, own_share}, reverse=True)
    if args.runs == NODE_PLAN_RUNS and own_share in args.shares and not asked:
        # the plan's own rows back at the bisect's own share
        own = plan_nodes(plan, (1, 4), trials=args.runs, of=PLAN_RUNS)
    trial = Noise(*(args.trial_rates or TRIAL_ERROR_RATES))
    culprits, seeds = common_draws(plan, max(args.runs, PLAN_RUNS), 0)
    culprits, seeds = culprits[:args.runs], seeds[:args.runs]
    c = plan.costs
    print(f"{args.profile}: launch {c.launch_s:.0f} s, switch {c.switch_s:.0f} s, full probe "
          f"{c.probe_s:.0f} s, {args.runs} simulated bisects per row; trial probe asked at "
          f"{trial.false_fail:g} / {trial.false_pass:g}"
          + (f"; search confidence {args.confidence:g}" if args.confidence else "")
          + (f"; launch {args.launch:g} s" if args.launch is not None else "")
          + (f"; {args.pool} engines a node" if args.pool else "")
          + ("; after a failing run (block 0's ends cached)" if args.after_run else "")
          + ("; block 0's good end cached" if args.good_cached else "")
          + ("; noiseless verdicts" if args.noiseless else ""))
    print(f"{'share':>6}  {'look 1':>6}  {'P(look2)':>8}  {'1 node':>7}  {'p90':>6}  "
          f"{'P(ok)':>6}  {'low':>6}  {'launches':>8}  {'ends':>6}  {'trials':>6}  "
          f"{'4 nodes':>7}  {'p90':>6}  {'floor 1':>7}  {'floor 4':>7}")
    for share in args.shares:
        cfg = at_share(plan, prep.engine.spec, share, prep.question.load_time, trial)
        if args.confidence:
            cfg = replace(cfg, confidence=args.confidence)
        if args.launch is not None or args.pool:
            cfg = replace(cfg, costs=replace(
                cfg.costs, launch_s=cfg.costs.launch_s if args.launch is None else args.launch,
                pool=args.pool or cfg.costs.pool))
        if args.after_run:
            cfg = replace(cfg, costs=replace(cfg.costs, ends0_cached=True))
        if args.good_cached:
            cfg = replace(cfg, costs=replace(cfg.costs, good0_cached=True))
        if args.noiseless:
            cfg = replace(cfg, noise=Noise(0.0, 0.0), trial_noise=Noise(0.0, 0.0))
        one = node_row(cfg, 1, 1, True, True, False, culprits, seeds)
        four = sharded_row(cfg, 4, True, True, culprits, seeds)
        floors = [float(np.mean([floor_run(cfg, k, x, (four.ends or "alone") if k > 1
                                           else "alone") for x in culprits])) for k in (1, 4)]
        if share == own_share and args.runs == NODE_PLAN_RUNS and not asked:
            assert abs(one.mean_wall_s - own.row(1, True).mean_wall_s) < 1e-6, one
            assert abs(four.mean_wall_s - own.row(4, True, True).mean_wall_s) < 1e-6, four
        phases, runs = _phases(cfg, culprits, seeds)
        print(f"{share:>6.2f}  {cfg.costs.look1_fraction:>6.3f}  {cfg.costs.look2_chance:>8.3g}  "
              f"{one.mean_wall_s:>7.0f}  {one.p90_wall_s:>6.0f}  {one.p_correct:>6.4f}  "
              f"{one.p_correct_low:>6.4f}  {one.mean_launches:>8.2f}  {phases['ends']:>6.0f}  "
              f"{phases['trials'] + phases['remedy']:>6.0f}  {four.mean_wall_s:>7.0f}  "
              f"{four.p90_wall_s:>6.0f}  {floors[0]:>7.0f}  {floors[1]:>7.0f}", flush=True)
        for k in (1, 4):
            print(f"        {_any_search_floor(cfg, k)}", flush=True)
            print(f"        {_any_search_floor(cfg, k, fresh_look=True)}", flush=True)
            if k == 1 and args.exact:  # one engine a node (the table's state is one)
                exact = exact_floor(cfg) if cfg.costs.pool == 1 else None
                print(f"        {exact.line()}" if exact else
                      "        exact floor: one engine a node only", flush=True)
            if k == 1 and args.genie and cfg.costs.pool == 1:
                floor, price, states = noisy_floor(cfg, solve=c_solver(genie_binary))
                print(f"        floor at the trial probe's {cfg.trial_noise.false_fail:g} error "
                      f"rate (the genie's), 1 node: {floor:.0f} s at P(correct) >= 0.99 (price "
                      f"{price:.0f} s on a wrong name; {states} states)", flush=True)
        if args.by_class:
            _by_class(cfg, culprits, runs, exact if args.exact else None)


def _phases(cfg: Setup, culprits, seeds) -> tuple[dict[str, float], list]:
    """The one-node row's mean seconds per phase, and its simulated bisects (the same ones)."""
    import random

    from dsv4bisect.bisect.plan.simulate import PHASES, search_memo, simulate

    memo = search_memo(cfg, 1, True)
    runs = [simulate(cfg, 1, c, random.Random(s), True, memo) for c, s in zip(culprits, seeds)]
    return {p: float(np.mean([r.phase_s[p] for r in runs])) for p in PHASES}, runs


# The fewest launches a one-engine bisect can spend on a culprit class, by its rules: the ends
# first (∅, then every load-time candidate's state), a FAIL without each load-time candidate
# that is not a culprit (∅ again for a call-time culprit; the culprits' own state otherwise), and
# the remedy check (every candidate but the culprits: the other load-time state where a culprit
# is load-time); a pair of load-time culprits also needs each alone, and the bad end's state back
# for the fresh evidence after the lead. With two load-time candidates (docs/performance.md,
# Part 6, derives each).
FEWEST_LAUNCHES = {("single", 0): 3, ("single", 1): 4, ("pair", 0): 3, ("pair", 1): 4,
                   ("pair", 2): 5}


def _any_search_floor(cfg: Setup, nodes: int = 1, p_correct: float = 0.99,
                      fresh_look: bool = False) -> str:
    """A floor on the mean wall on `nodes` nodes for any search and any order of its trials,
    under these costs and the bisect's rules: the ends at look 1 (`floor_run`; on several
    nodes under the cheaper of the executor's ends schedules), the launches beyond them, and
    the trials the information needs. A binary trial at the trial probe's error rates carries
    at most the channel's capacity C (design.capacity) about the culprit set, so naming it right
    with probability `p_correct` takes at least (H - h(Pe) - Pe log2(N - 1)) / C trials in
    expectation (Fano's inequality over a search with a stopping time), H the prior's entropy
    over its N culprit sets (the flat prior the plan draws from). The ends, the good end's
    re-tests and the bad end's carry nothing about which set it is (every set gives the same
    outcomes there). Each non-end trial pays at least the cheaper trial probe and a switch, a
    launch's first trial `launch_s` in place of the switch.

    `fresh_look`: also the rules' fresh look (search/confirm.py), the trials a set needs after
    it first led at the search's confidence, in a world whose culprits are drawn from the
    search's own prior (its tier weights). There the posterior is calibrated, so that lead is
    right with P >= the confidence and Fano bounds the trials before it at 1 - confidence; the
    fresh trials come after. In the plan's flat world the search's prior is not the world's, so
    this is not a floor there (a search with another prior could lead early and look afresh on
    trials that also inform); it is what a search that knows the world's prior cannot beat.
    One node: the fewest launches beyond the ends are FEWEST_LAUNCHES's (none counted without
    that table). K nodes: a round runs at
    most K trials, each node paying its switch and its share of their probes, so the rounds
    last at least trials x (switch + probe) / K; a bisect whose culprits need a load-time state
    the ends left no engine in pays one launch round (with the ends together, ∅ and the bad
    end's state are up: every culprit set holding a load-time candidate where there are two;
    with the ends one after the other on every node, every set where there is one)."""
    flat = HypothesisSpace(cfg.candidates, cfg.max_order,
                           Priors(weights=dict(cfg.weights)) if fresh_look else Priors())
    prior = np.exp(flat.log_prior[:flat.n_sets])
    prior /= prior.sum()
    n = len(prior)

    def fano(miss: float) -> float:  # bits a search must gather to name the set, wrong at `miss`
        return max(float(entropy(prior)) - float(binary_entropy(np.array(miss)))
                   - miss * math.log2(n - 1), 0.0)

    miss = 1.0 - p_correct
    bits = fano(miss)
    c = cfg.costs
    everything = frozenset(cfg.candidates)
    load = c.load_time & everything
    sets = [flat.hypothesis(i).members for i in range(n)]
    trial_s = min(c.like_good_fraction, c.like_bad_fraction) * c.probe_s + c.switch_s
    # The rules' fresh look (search/confirm.py): a set is reported only after trials run since
    # it first led at the search's confidence: one holding it and no other candidate
    # (sufficiency; for a single only where engine trials or several nodes ask it) and one per
    # member x holding C minus x and not x, each a configuration of its own.
    fresh_single = bool(c.sequential or nodes > 1)

    def fresh(size: int) -> int:
        return (size if size > 1 else 0) + (1 if size == cfg.max_order or fresh_single else 0)

    most = max(fresh(len(s)) for s in sets)
    after = (sum(float(w) * fresh(len(s)) for w, s in zip(prior, sets)) - most * miss
             if fresh_look else 0.0)
    led = fano(1.0 - cfg.confidence) / capacity(cfg.trial_noise) if fresh_look else 0.0
    trials = max(bits / capacity(cfg.trial_noise), led + after)
    if nodes == 1:
        fewest = FEWEST_LAUNCHES if len(load) == 2 else {}
        own = 2 if load else 1  # the ends' launches
        launches = {ALONE: sum(float(w) * (fewest.get(_culprit_class(s, load), own) - own)
                               for w, s in zip(prior, sets))}
    else:
        launches = {TOGETHER: sum(float(w) for w, s in zip(prior, sets)
                                  if s & load and len(load) >= 2),
                    ALONE: float(bool(load))}
    # on K nodes the fresh trials take a round of their own after the lead's
    search_s = (trials * trial_s if nodes == 1 else
                max(bits / capacity(cfg.trial_noise) * trial_s / nodes,
                    led * trial_s / nodes + (1.0 - miss) * trial_s * fresh_look))
    ends_s = {ends: floor_run(cfg, nodes, everything, ends) for ends in launches}
    floors = {ends: ends_s[ends] + search_s + beyond * (c.launch_s - c.switch_s)
              for ends, beyond in launches.items()}
    ends = min(floors, key=floors.get)
    unit = "launch rounds" if nodes > 1 else "launches"
    where = f" ({ends})" if nodes > 1 else ""
    per = f" / {nodes}" if nodes > 1 else ""
    cap = capacity(cfg.trial_noise)
    if not fresh_look:
        search = f"{trials:.2f} trials x {trial_s:.0f} s{per}"
        why = f"{bits:.2f} needed at P(correct) {p_correct:g}, {cap:.3f} bits a trial"
        title = "floor for any search"
    else:
        search = (f"{trials:.2f} trials x {trial_s:.0f} s" if nodes == 1 else
                  f"{search_s:.0f} s of rounds (the lead's {led:.2f} trials x {trial_s:.0f} s"
                  f"{per}, then a round of its fresh look)")
        why = (f"{fano(1.0 - cfg.confidence):.2f} by the first lead at confidence "
               f"{cfg.confidence:g} = {led:.2f} trials at {cap:.3f} bits a trial, then "
               f"{after:.2f} fresh-look trials")
        title = "with the rules' fresh look, culprits from the search's own prior"
    return (f"{title}, {nodes} node{'s' if nodes > 1 else ''}: "
            f"{floors[ends]:.0f} s = the ends {ends_s[ends]:.0f} s"
            f"{where} + {search} + {launches[ends]:.2f} {unit} "
            f"beyond the ends x {c.launch_s - c.switch_s:.0f} s ({float(entropy(prior)):.2f} "
            f"bits over {n} culprit sets, {why})")


def _culprit_class(culprits: frozenset[str], load: frozenset[str]) -> tuple[str, int]:
    return ("single" if len(culprits) == 1 else "pair", len(culprits & load))


def _by_class(cfg: Setup, culprits, runs, exact=None) -> None:
    """The one-node row per class of culprit set: single or pair, by its load-time members;
    with `exact` (an ExactFloor), the certain optimum's trials and launches beyond the ends
    per class, weighted by the world's prior."""
    load = cfg.costs.load_time & frozenset(cfg.candidates)
    keys = [_culprit_class(c, load) for c in culprits]
    classes: dict[tuple[str, int], list[int]] = {}
    for i, key in enumerate(keys):
        classes.setdefault(key, []).append(i)
    fewest = FEWEST_LAUNCHES if len(load) == 2 else {}
    optimum: dict[tuple[str, int], np.ndarray] = {}  # prior, trials, launches beyond the ends
    for members, p, n_trials, n_launches in exact.per_set if exact else ():
        key = _culprit_class(members, load)
        optimum[key] = optimum.get(key, np.zeros(3)) + (p, p * n_trials, p * n_launches)
    print(f"  {'culprits':<22} {'draws':>5}  {'mean':>6}  {'p90':>6}  {'P(ok)':>6}  "
          f"{'launches':>8}  {'fewest':>6}  {'trials':>6}"
          + ("  optimum beyond the ends: trials, launches" if exact else ""))
    for key in sorted(classes):
        idx = classes[key]
        wall = np.array([runs[i].wall_s for i in idx])
        share, trials, launches = optimum.get(key, (1.0, np.nan, np.nan))
        best = f"  {trials / share:>6.2f}  {launches / share:>4.2f}" if exact else ""
        print(f"  {key[0] + f', {key[1]} load-time':<22} {len(idx):>5}  {wall.mean():>6.0f}  "
              f"{np.percentile(wall, 90):>6.0f}  {np.mean([runs[i].correct for i in idx]):>6.4f}  "
              f"{np.mean([runs[i].launches for i in idx]):>8.2f}  "
              f"{fewest.get(key, float('nan')):>6.0f}  "
              f"{np.mean([runs[i].trials for i in idx]):>6.1f}{best}")
    if fewest:
        floor = np.mean([fewest[key] for key in keys])
        print(f"  fewest launches over the draws: {floor:.2f}, against "
              f"{np.mean([r.launches for r in runs]):.2f}")


if __name__ == "__main__":
    main()
