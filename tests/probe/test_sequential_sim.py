"""The issue's simulation test of the sequential trial probe, on the standard tier's grid.

The good end's accuracy per cell is MEASURED on the embedded engine (tests/probe/data/
embedded_accuracy.json: needle 99.5 %, copy 95.2 %, vartrack 50 %; 81.7 % over the standard
grid), mapped onto the standard grid by length rank (512..4096 -> 4k..64k; vartrack 256..2048)
and nearest depth. End pairs span a 5 pp to a 100 pp gap (the bad end loses 6 % to 100 % of
the good end's right answers), faults spread over every cell or confined to the 64k cells, and
drift-only differences (the split-K merge fault's and mma-decode's drift from the calibration
table). Each scenario: trials that truly behave like the good end and like the bad end, every
one through the real `SequentialTrial`; misclassification must stay at or below the rates the
test is asked to hold. `python tests/probe/test_sequential_sim.py` prints the table in
docs/probe.md.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from dsv4bisect.probe.grid import Cell
from dsv4bisect.probe.sequential_plan import (
    DriftFault,
    Scenario,
    SimSummary,
    drift_lengths,
    simulate,
    spec_cells,
    summarise,
)
from dsv4bisect.probe.spec import tier_spec

DATA = json.loads((Path(__file__).parent / "data" / "embedded_accuracy.json").read_text())
SPEC = tier_spec("standard")
FULL = 1008 + 16  # accuracy requests + drift transcripts of the standard tier


def measured_accuracy(cell: Cell) -> float:
    fam = DATA["families"][cell.family]
    length = fam["lengths"][SPEC.lengths.index(cell.length)]
    if cell.family == "vartrack":  # one case per cell measured: its length's rate
        got = [v for k, v in fam["counts"].items() if k.startswith(f"L{length}/")]
        return sum(r for r, _ in got) / sum(n for _, n in got)
    depth = min(fam["depths"], key=lambda d: abs(d - cell.depth))
    right, n = fam["counts"][f"L{length}/d{depth:g}"]
    return right / n


# The condition measured for the accuracy table (cold, alone): the test's world is the tier's
# 1008 concurrency-1 requests; its warm-at-16 groups are tests/probe/test_sequential_conditions.py's.
WORLD = [c for c in spec_cells(SPEC, measured_accuracy) if c.concurrency == 1]
ACC = sum(c.accuracy * c.cases for c in WORLD) / sum(c.cases for c in WORLD)
GAP5 = 0.05 / ACC  # the loss rate that makes a 5 pp accuracy gap
SCENARIOS = {
    "5 pp gap, every cell": Scenario(loss_rate=GAP5),
    "10 % lost, every cell": Scenario(loss_rate=0.1),
    "30 % lost, every cell": Scenario(loss_rate=0.3),
    "100 % lost (81.7 pp gap)": Scenario(loss_rate=1.0),
    "30 % lost, 64k cells only": Scenario(loss_rate=0.3, fault_lengths=(65536,)),
    "100 % lost, 64k cells only": Scenario(loss_rate=1.0, fault_lengths=(65536,)),
    "drift only (split-K merge fault)": Scenario(loss_rate=0.0,
                                                 drift=DriftFault(0.0028, 0.9671)),
    "drift only (mma-decode, a WARN)": Scenario(loss_rate=0.0,
                                                drift=DriftFault(0.00083, 0.9868)),
}
# Not required by the issue, reported beside: nondeterministic faults (a like-bad trial loses
# fresh cases at the bad end's rate) and a noisy server with a benign numeric change.
HARDER = {
    "5 pp gap, fresh draws": Scenario(loss_rate=GAP5, reproduce=False),
    "30 % lost, fresh draws": Scenario(loss_rate=0.3, reproduce=False),
    "10 % lost, 64k only, fresh draws": Scenario(loss_rate=0.1, fault_lengths=(65536,),
                                                 reproduce=False),
    "30 % lost, 1 % server noise + 1 % benign flips": Scenario(
        loss_rate=0.3, noise_flip=0.01, benign_flip=0.01, reproduce=False),
    "10 % lost, 1 % server noise + 1 % benign flips": Scenario(
        loss_rate=0.1, noise_flip=0.01, benign_flip=0.01, reproduce=False),
}


def run(scenario: Scenario, rates: tuple[float, float], sims: int, seed: int = 0
        ) -> tuple[SimSummary, SimSummary]:
    rng = random.Random(seed)
    drift = drift_lengths(SPEC)
    out = []
    for truth in ("good", "bad"):
        ds = [simulate(WORLD, scenario, truth, false_fail=rates[0], false_pass=rates[1],
                       rng=rng, drift_requests=len(drift), drift_tokens=sum(drift))
              for _ in range(sims)]
        out.append(summarise(ds, truth, lambda d: float(d.prompt_tokens)))
    return out[0], out[1]


def test_the_measured_good_end_is_not_perfect() -> None:
    assert 0.8 < ACC < 0.85
    assert {c.family for c in WORLD} == {"needle", "copy", "vartrack"} and len(WORLD) == 144


@pytest.mark.parametrize("name", ["30 % lost, every cell", "30 % lost, 64k cells only",
                                  "drift only (split-K merge fault)"])
def test_misclassification_within_the_rates_quick(name: str) -> None:
    good, bad = run(SCENARIOS[name], (0.05, 0.05), sims=60)
    assert good.wrong <= 0.05 and bad.wrong <= 0.05
    assert bad.mean_requests <= FULL / 10  # the issue: a tenth of the standard tier at most


@pytest.mark.slow
@pytest.mark.parametrize("rates", [(0.05, 0.05), (0.01, 0.01)])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_misclassification_within_the_rates(name: str, rates: tuple[float, float]) -> None:
    good, bad = run(SCENARIOS[name], rates, sims=200)
    assert good.wrong <= rates[0], good
    assert bad.wrong <= rates[1], bad
    if name.startswith("30 % lost"):
        assert bad.mean_requests <= FULL / 10


if __name__ == "__main__":  # the table in docs/probe.md
    sims = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    print(f"good end accuracy over the standard grid: {ACC:.1%}; {sims} trials per cell")
    print("| scenario | rates | like good: wrong / between / requests | "
          "like bad: wrong / between / requests |")
    print("| --- | --- | --- | --- |")
    for table in (SCENARIOS, HARDER):
        for name, sc in table.items():
            for rates in ((0.05, 0.05), (0.01, 0.01)):
                g, b = run(sc, rates, sims)
                print(f"| {name} | {rates[0]:g} / {rates[1]:g} | {g.wrong:.1%} / "
                      f"{g.between:.1%} / {g.mean_requests:.1f} | {b.wrong:.1%} / "
                      f"{b.between:.1%} / {b.mean_requests:.1f} |", flush=True)
