"""What a probe can detect: the smallest accuracy loss it FAILs with 95 % probability.

Model: the candidate independently loses each answer the baseline got right with probability q
and gains none (c = 0, the deterministic-engine case). The overall test FAILs when the exact
one-sided McNemar p < ALPHA_OVERALL, i.e. when b >= 7; so with n baseline-right answers the probe
detects q when P(Binomial(n, q) >= 7) >= 0.95. The accuracy drop is q × baseline accuracy.
A loss confined to one cell of k cases must reach the Holm threshold of its cell, or the overall
threshold, whichever is lower. With gains (c > 0) or a noisy A/A the power is lower: statements
are upper bounds on sensitivity, never more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsv4bisect.probe.grid import cells
from dsv4bisect.probe.spec import ProbeSpec, tier_spec
from dsv4bisect.probe.stats import min_detectable_rate, min_significant_discordant, zero_event_bound
from dsv4bisect.probe.verdict import ALPHA_CELL, ALPHA_OVERALL

POWER = 0.95


def accuracy_power(n_right: int, baseline_accuracy: float | None, b: int = 0) -> dict[str, Any]:
    """Power of the overall test given the baseline's right answers (for a verdict)."""
    threshold = min_significant_discordant(ALPHA_OVERALL)
    q = min_detectable_rate(n_right, threshold, POWER)
    drop = q * baseline_accuracy if q is not None and baseline_accuracy is not None else None
    if q is None:
        statement = (f"no power: {n_right} baseline-right answers, the overall test needs at "
                     f"least {threshold} lost answers")
    else:
        statement = (f"detects with 95 % probability a loss of >= {q:.0%} of the "
                     f"{n_right} answers the baseline got right")
        if drop is not None:
            statement += f" (an accuracy drop of >= {drop * 100:.1f} pp)"
    out = {"alpha": ALPHA_OVERALL, "power": POWER, "n_baseline_right": n_right,
           "baseline_accuracy": baseline_accuracy, "min_detectable_loss_rate": q,
           "min_detectable_drop": drop, "statement": statement, "zero_loss_bound": None}
    if b == 0 and n_right > 0:
        out["zero_loss_bound"] = zero_event_bound(n_right)
    return out


@dataclass(frozen=True)
class TierPower:
    """The power a tier can have at best (every baseline answer right)."""

    tier: str
    accuracy_cases: int  # paired accuracy requests per run (all arms and levels)
    cells: int
    cases_per_cell: int
    min_detectable_loss_rate: float | None
    cell_threshold: int  # lost answers one cell needs on its own
    min_detectable_cell_loss_rate: float | None  # a loss confined to one cell
    drift_transcripts: int

    def statement(self) -> str:
        q, qc = self.min_detectable_loss_rate, self.min_detectable_cell_loss_rate
        overall = (f"an accuracy drop of >= {q * 100:.1f} pp overall" if q is not None
                   else "no accuracy drop (too few cases)")
        cell = (f"a drop of >= {qc * 100:.0f} pp confined to one cell" if qc is not None
                else "no drop confined to a single cell")
        return f"{self.tier}: detects {overall} and {cell} (95 % power, 100 % baseline accuracy)"


def tier_power(spec: ProbeSpec) -> TierPower:
    """Computed from the spec's grid and the verdict rule's alphas (thinking arm left out)."""
    plan = [(c, n, arm) for c, n in cells(spec) if c.family != "drift"
            for arm, _ in spec.conditions()  # (arm, concurrency) pairs each case runs under
            if spec.arm_takes(arm, c.family)]
    n_cases = sum(n for _, n, _ in plan)
    n_cells = len(plan)
    overall = min_significant_discordant(ALPHA_OVERALL)
    cell_alone = min_significant_discordant(ALPHA_CELL / max(1, n_cells))
    threshold = min(overall, cell_alone)
    return TierPower(
        tier=spec.tier, accuracy_cases=n_cases, cells=n_cells, cases_per_cell=spec.cases_per_cell,
        min_detectable_loss_rate=min_detectable_rate(n_cases, overall, POWER) if n_cases else None,
        cell_threshold=threshold,
        min_detectable_cell_loss_rate=min_detectable_rate(spec.cases_per_cell, threshold, POWER),
        drift_transcripts=sum(n for c, n in cells(spec) if c.family == "drift"),
    )


def power_table(tiers: tuple[str, ...] = ("ci", "smoke", "standard", "deep")) -> list[str]:
    """Markdown rows of the tier table in docs/probe.md (a test keeps the doc in sync)."""
    rows = ["| tier | accuracy requests / run | cells | cases / cell | drift transcripts | "
            "overall drop detected (95 %) | drop confined to one cell |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in tiers:
        p = tier_power(tier_spec(name))
        q, qc = p.min_detectable_loss_rate, p.min_detectable_cell_loss_rate
        rows.append(f"| `{name}` | {p.accuracy_cases} | {p.cells} | {p.cases_per_cell} | "
                    f"{p.drift_transcripts} | "
                    f"{'none' if q is None else f'≥ {q * 100:.1f} pp'} | "
                    f"{'not detectable' if qc is None else f'≥ {qc * 100:.0f} pp'} |")
    return rows
