"""A bisect between two configurations at 20–40 differences: trials, launches, wall and
P(correct) against the information bound, with the tier prior and with a flat one.

    python tests/benchmarks/bench_difference_scale.py [--n 20 30 40] [--runs 100]
                                                      [--release 0.5.23]

For each n, B is `dsv4-flash-tp8-latest` with n DeepSeek-V4 env switches of the release's
catalog (patching/switch_data) changed from their defaults: drawn at random (seed n), so the
tiers come in the catalog's own proportions (mostly kernel and precision), or with `--even`
round-robin over the tiers. The bisect is assembled as `bisect --good-config
A --bad-config B` assembles it (bisect/config_question.py, bisect/setup.py: SGLang's assumed
costs, every env switch load-time) and simulated end to end (plan/simulate.py: the ends, the
trials, the remedy check, the confirmation) against hidden culprit sets — singles and
interacting pairs — drawn two ways:

* field-like: from the tier prior itself (kernel and precision switches most often to blame,
  as in the field reports; docs/bisect.md "Bisecting two configurations");
* flat: every single and pair equally likely (the tier prior's worst case: the culprit is as
  often a scheduling or logging switch).

and searched with the tier prior and with a flat prior. The information bound is the entropy
of the culprit draw in bits (noiseless: one bit per trial at best), and that over the capacity
of the probe's 5 %/5 % channel (1 − H(0.05) = 0.71 bits per trial).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np


def profile_pair(folder: Path, n: int, release: str, even: bool = False) -> tuple[str, str]:
    from dsv4bisect.patching.switch_catalog import load_catalog

    from dsv4bisect.bisect.switch_info import other_vendor
    from dsv4bisect.config.resolve import resolve

    # the variables the profile's patches drive (their off values) are theirs, not B's to set
    driven = {k for p in resolve("dsv4-flash-tp8-latest").processes for k, _ in p.env}
    switches = [s for s in load_catalog(release).switches
                if s.kind == "env" and s.name not in driven and not other_vendor(s.name, "sm120")]
    rng = random.Random(n)
    if even:  # round-robin over the tiers: as many scheduling and logging as kernel switches
        by_tier: dict[str, list] = {}
        for s in rng.sample(switches, len(switches)):
            by_tier.setdefault(s.tier, []).append(s)
        chosen = []
        while len(chosen) < n and any(by_tier.values()):
            for tier in sorted(by_tier):
                if by_tier[tier] and len(chosen) < n:
                    chosen.append(by_tier[tier].pop())
    else:
        chosen = rng.sample(switches, n)
    env = {}
    for s in chosen:
        d = s.default_for("sm120")
        env[s.name] = ("0" if d else "1") if isinstance(d, bool) or d is None else \
            str(d + 1) if isinstance(d, (int, float)) else f"{d}-other"
    bad = folder / f"b{n}.yaml"
    lines = ["schema_version: 1", f"name: b{n}", "extends: dsv4-flash-tp8-latest",
             "engine:", "  env:"] + [f"    {k}: {v!r}".replace("'", '"') for k, v in env.items()]
    bad.write_text("\n".join(lines) + "\n")
    return "dsv4-flash-tp8-latest", str(bad)


def entropy_bits(space) -> float:  # noqa: ANN001 - a HypothesisSpace
    p = np.exp(space.log_prior[: space.n_sets])
    p = p / p.sum()
    return float(-(p * np.log2(p)).sum())


def main() -> None:
    from dsv4bisect.bisect.config_question import config_question
    from dsv4bisect.bisect.plan.simulate import draw_culprits, search_memo, simulate
    from dsv4bisect.bisect.search.hypotheses import HypothesisSpace, Priors
    from dsv4bisect.bisect.setup import BisectRequest, prepare

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, nargs="+", default=[20, 30, 40])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--release", default="0.5.23")
    ap.add_argument("--even", action="store_true", help="draw the switches evenly over the "
                    "tiers instead of in the catalog's proportions")
    args = ap.parse_args()
    capacity = 1 - (-(0.05 * math.log2(0.05) + 0.95 * math.log2(0.95)))
    with tempfile.TemporaryDirectory(prefix="diff-scale-") as tmp:
        for n in args.n:
            a, b = profile_pair(Path(tmp), n, args.release, args.even)
            q = config_question(a, b)
            prep = prepare(q, BisectRequest(ledger_path=Path(tmp) / "none.sqlite"))
            tiered = prep.setup()
            flat_setup = replace(tiered, weights={}, base_weights={})
            tiers = {}
            for name in q.candidates:
                tiers[q.tier_names[name].split()[0]] = tiers.get(q.tier_names[name].split()[0],
                                                                 0) + 1
            print(f"n = {n}: {len(q.candidates)} candidates, tiers {tiers}, "
                  f"load-time {len(q.load_time)}", flush=True)
            for draw_name, weights in (("field-like", dict(tiered.weights)), ("flat", {})):
                space = HypothesisSpace(q.candidates, 2, Priors(weights=weights))
                bits = entropy_bits(space)
                rng = random.Random(1000 + n)
                draws = [(draw_culprits(space, rng), rng.getrandbits(32))
                         for _ in range(args.runs)]
                for prior_name, cfg in (("tier prior", tiered), ("flat prior", flat_setup)):
                    t0 = time.perf_counter()
                    memo = search_memo(cfg, 1, True)
                    runs = [simulate(cfg, 1, c, random.Random(s), True, memo) for c, s in draws]
                    pairs = sum(len(c) == 2 for c, _ in draws)
                    print(f"  culprits {draw_name} ({pairs} pairs of {len(draws)}), "
                          f"{prior_name}: trials {np.mean([r.trials for r in runs]):.1f}, "
                          f"launches {np.mean([r.launches for r in runs]):.1f}, wall "
                          f"{np.mean([r.wall_s for r in runs]) / 3600:.1f} h, P(correct) "
                          f"{np.mean([r.correct for r in runs]):.3f}; bound {bits:.1f} "
                          f"trials noiseless, {bits / capacity:.1f} at 5 %/5 % "
                          f"({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
