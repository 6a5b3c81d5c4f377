"""`--plan` for the whole bisect: ends, A/A, trials, remedy check and fresh confirmation, priced
as the driver runs them (pricing.py), with and without each lever: the one simulated bisect
(simulate.py) on one node.

Levers: **hot** switching (off: every trial a fresh launch), the **sequential** trial probe
(off: every trial probed at full size, at the ends' error rates), **priors** from the
microtest (off: the weights without them), the **priced** design (off: information per trial).
Every configuration of the levers runs against the same hidden culprit sets and the same random
outcome streams (common random numbers), so the differences are the levers', not the draw's.
The culprit sets are drawn from a *flat* prior (every candidate the same weight, the search's
order masses): a prior lever judged against culprits drawn from its own prior would always win.
Deterministic given `seed`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dsv4bisect.bisect.plan.simulate import (  # noqa: F401 - Setup, LEVERS: this API's too
    LEVERS,
    PHASES,
    NodeRun,
    Setup,
    available_levers,
    common_draws,
    search_memo,
    simulate,
)
from dsv4bisect.errors import BisectError
from dsv4bisect.probe.stats import wilson


@dataclass(frozen=True)
class Figures:
    """One configuration of the levers over every simulated bisect."""

    mean_wall_s: float
    p90_wall_s: float
    mean_trials: float  # probe runs, remedy and confirmation included
    mean_launches: float  # engine launches (every trial without hot switching)
    p_correct: float
    phase_s: Mapping[str, float]  # mean seconds per phase (PHASES)
    p_correct_low: float = 0.0  # Wilson's 95 % lower bound on it over the runs



@dataclass(frozen=True)
class WholePlan:
    runs: int
    levers: tuple[str, ...]  # the levers this bisect has (the others cannot be turned on)
    with_levers: Figures
    without_levers: Figures | None  # every lever off: today's bisect, everything counted
    each_off: Mapping[str, Figures]  # one lever off in turn

    def saves_s(self, lever: str) -> float:
        return self.each_off[lever].mean_wall_s - self.with_levers.mean_wall_s


def plan_bisect(setup: Setup, *, trials: int = 100, seed: int = 0,
                compare: bool = True) -> WholePlan:
    """Simulate `trials` whole bisects per configuration of the levers (`compare=False`: only
    with every lever on)."""
    if trials < 1:
        raise BisectError("the plan needs at least one simulated run", "use trials >= 1")
    levers = available_levers(setup)
    culprits, seeds = common_draws(setup, trials, seed)

    def figures(off: Sequence[str]) -> Figures:
        cfg = setup.without(off)
        priced = "priced" not in off
        memo = search_memo(cfg, 1, priced)
        runs = [simulate(cfg, 1, c, random.Random(s), priced, memo)
                for c, s in zip(culprits, seeds)]
        return _figures(runs)

    if not compare:
        return WholePlan(trials, levers, figures(()), None, {})
    return WholePlan(trials, levers, figures(()), figures(levers),
                     {lever: figures((lever,)) for lever in levers})


def _figures(runs: list[NodeRun]) -> Figures:
    wall = np.array([sum(r.phase_s.values()) for r in runs])  # by phase (NodeRun.wall_s)
    return Figures(
        mean_wall_s=float(wall.mean()),
        p90_wall_s=float(np.quantile(wall, 0.9)),
        mean_trials=float(np.mean([r.trials for r in runs])),
        mean_launches=float(np.mean([r.launches for r in runs])),
        p_correct=sum(r.correct for r in runs) / len(runs),
        phase_s={p: float(np.mean([r.phase_s[p] for r in runs])) for p in PHASES},
        p_correct_low=wilson(sum(r.correct for r in runs), len(runs))[0],
    )


