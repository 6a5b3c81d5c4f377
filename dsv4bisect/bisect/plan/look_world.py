"""The grid of a look of the ends, and the sequential trial probe simulated on it (pure, seeded;
docs/bisect.md, "Ends that stop when their question is answered").

A look at `case_share` below 1 keeps `cases_kept(n, share)` of each (family, length) stratum's
n accuracy cases and every drift transcript; a block settled at that look has its trials replay
its cases, so the trial probe the plan prices must be simulated on that grid, not the tier's.
`look_cells` is that grid for the plan: the tier's cells with the cases the case builder keeps
(`grid.kept_case_ids`). Every cell of a stratum has the same nominal length, so the computed tokens of
a look (costs.probe_shape) do not depend on which cells the shuffle picks; only the trial
simulation's cells hold the counts it gives.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dsv4bisect.bisect.end_looks import GOOD_ACCURACY, look2_chance, settled
from dsv4bisect.probe.grid import Cell, cells, kept_case_ids
from dsv4bisect.probe.sequential_plan import SMALLEST_LOSS
from dsv4bisect.probe.spec import ProbeSpec


def look_cells(spec: ProbeSpec) -> list[tuple[Cell, int]]:
    """Every (cell, cases kept in it) of the look `spec.case_share`, in the tier's request
    order; drift cells whole. The cases are the case builder's own (`grid.kept_case_ids`), so
    the plan simulates the trials on the grid the runner probes. At share 1: `cells(spec)`."""
    tier = cells(spec.replace(case_share=1.0))  # the whole tier's grid, whatever cells() keeps
    kept = kept_case_ids(spec)
    if kept is None:
        return tier
    counts = [(cell, n if cell.family == "drift"
               else sum(f"{cell.key}/{i}" in kept for i in range(n))) for cell, n in tier]
    return [(cell, n) for cell, n in counts if n]


def look_trial(spec: ProbeSpec, false_fail: float, false_pass: float, loss_rate: float,
               sims: int, good_accuracy: float = 0.9, seed: int = 0) -> object:
    """`sequential_plan.plan_trial` on the look's grid (`look_cells`): its world, cost model and
    summary, with each stratum at the cases the look keeps."""
    from dsv4bisect.probe import sequential_plan as sp

    grid = look_cells(spec)
    world = [sp.SimCell(c.key, c.family, c.length, n, good_accuracy, arm, level)
             for arm, level in spec.conditions()
             for c, n in grid if c.family != "drift" and spec.arm_takes(arm, c.family)]
    drift = [c.length for c, n in grid if c.family == "drift" for _ in range(n)]
    overhead = sp.REQUEST_OVERHEAD_TOKENS

    def cost(d: object) -> float:
        return d.prompt_tokens + d.requests * overhead  # type: ignore[attr-defined]

    full = (sum((w.length + overhead) * w.cases for w in world) + sum(drift)
            + len(drift) * overhead)
    rng = random.Random(seed)
    out = {}
    for truth in ("good", "bad"):
        decisions = [sp.simulate(world, sp.Scenario(loss_rate=loss_rate), truth,
                                 false_fail=false_fail, false_pass=false_pass, rng=rng,
                                 drift_requests=len(drift), drift_tokens=sum(drift))
                     for _ in range(sims)]
        out[truth] = sp.summarise(decisions, truth, cost)
    good, bad = out["good"], out["bad"]
    return sp.TrialProbePlan(
        good.mean_requests, bad.mean_requests, good.mean_cost / full, bad.mean_cost / full,
        false_fail, false_pass, sum(w.cases for w in world) + len(drift), good.between,
        bad.between, sims, overhead, loss_rate, good.wrong, bad.wrong)


@dataclass(frozen=True)
class LookOne:
    """The simulated world's bad end at look 1 (the plan's one simulated bisect draws it for
    every seed block's bad end): `pairs` paired accuracy answers, the good end right on each
    with `good_accuracy`, the bad end losing `loss_rate` of those (the verdict table's smallest
    loss, as the trial probe is priced), a deterministic engine (no answer gained). Judged by
    the probe's overall exact McNemar test and `end_looks.settles`. A bad end with hard
    signatures or a crash settles at look 1 whatever its count, and a loss
    confined to a cell may settle by its cell's Holm test: the world priced here, a loss spread
    thin over every cell, is the one where look 2 is likeliest."""

    pairs: int
    good_accuracy: float = GOOD_ACCURACY
    loss_rate: float = SMALLEST_LOSS

    def settles(self, rng: random.Random) -> bool:
        """One bad end's look-1 evidence, drawn: whether it settles the block's ends."""
        lost = sum(rng.random() < self.good_accuracy and rng.random() < self.loss_rate
                   for _ in range(self.pairs))
        return settled(lost, self.pairs)

    @property
    def look2_chance(self) -> float:
        """P(look 1 does not settle) in this world (`end_looks.look2_chance`)."""
        return look2_chance(self.pairs, self.good_accuracy, self.loss_rate)
