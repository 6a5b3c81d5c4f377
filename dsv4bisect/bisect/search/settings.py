"""Checks on the search's settings: each bad value is a BisectError with a hint."""

from __future__ import annotations

from collections.abc import Sequence

from dsv4bisect.bisect.search.design import Noise
from dsv4bisect.bisect.search.hypotheses import check_size
from dsv4bisect.errors import BisectError


def validate_settings(
    candidates: Sequence[str],
    noise: Noise,
    confidence: float,
    max_trials: int | None,
    parallel: int,
    max_order: int,
    design_discount: float,
    end_nodes: int = 1,
) -> None:
    if not candidates:
        raise BisectError("no candidate patches to bisect", "the good and bad ends are equal")
    if len(set(candidates)) != len(candidates):
        raise BisectError("a candidate is listed twice", ", ".join(candidates))
    noise.validate()
    if not 0.5 <= confidence < 1:
        raise BisectError(f"confidence {confidence} is outside [0.5, 1)", "e.g. 0.95")
    if max_trials is not None and max_trials < 2:
        raise BisectError("max_trials must allow the two end checks", "use at least 2")
    if parallel < 1:
        raise BisectError(f"parallel is {parallel}", "use at least 1")
    if not 1 <= end_nodes <= parallel:
        raise BisectError(f"an end on {end_nodes} of {parallel} nodes",
                          "end_nodes is between 1 and parallel")
    if not 1 <= max_order <= 3:
        raise BisectError(f"max_order {max_order} is not 1, 2 or 3", "use 1, 2 or 3")
    check_size(len(candidates), max_order)
    if not 0 < design_discount <= 1:
        raise BisectError(f"design_discount {design_discount} is outside (0, 1]",
                          "use a number above 0 and at most 1")
