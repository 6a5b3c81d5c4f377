"""A look of the ends (`ProbeSpec.case_share`): which cases the case builder keeps
(probe/grid.py `kept_case_ids`, bisect/end_looks.py)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4bisect.probe import grid
from dsv4bisect.probe.layout import calibrate
from dsv4bisect.probe.spec import TIER_NAMES, cases_kept, tier_spec
from dsv4bisect.probe.tasks import tasks_of
from dsv4bisect.probe.vocab import PROBE_VOCAB
from dsv4bisect.reference.chat import apply_chat_template

# The tiers' spec hashes before case_share existed: share 1 must not move them (the README's
# example fingerprints and every cached baseline are keyed by them).
TIER_HASHES = {"ci": "6fddef0f361ef126", "smoke": "390b16612c69f366",
               "standard": "651f3f087c572d00", "deep": "899bd2d37e793bdc"}
shares = st.floats(0.01, 1.0, allow_nan=False)


def byte_count(messages: list[dict[str, str]]) -> int:
    return len(apply_chat_template(messages))


def _strata(spec) -> Counter[tuple[str, int]]:
    return Counter((c.family, c.length) for c, n in grid.cells(spec) for _ in range(n)
                   if c.family != "drift")


def test_share_one_keeps_every_tier_hash() -> None:
    for tier in TIER_NAMES:
        spec = tier_spec(tier)
        assert spec.spec_hash() == TIER_HASHES[tier]
        assert spec.replace(case_share=1.0).spec_hash() == TIER_HASHES[tier]
        assert spec.replace(case_share=0.25).spec_hash() != TIER_HASHES[tier]
        assert grid.kept_case_ids(spec) is None


@settings(max_examples=60, deadline=None)
@given(tier=st.sampled_from(TIER_NAMES), share=shares, seed=st.integers(0, 2**31),
       block=st.integers(0, 50))
def test_each_stratum_keeps_its_count_deterministically(tier: str, share: float, seed: int,
                                                        block: int) -> None:
    spec = tier_spec(tier).replace(case_share=share, seed=seed, seed_block=block)
    kept = grid.kept_case_ids(spec)
    strata = _strata(spec)
    if share >= 1.0:
        assert kept is None
        return
    assert kept is not None
    got = Counter((cid.split("/")[0], int(cid.split("/")[1][1:])) for cid in kept)
    assert got == {k: cases_kept(n, share) for k, n in strata.items()}
    assert grid.kept_case_ids(spec) == kept  # the same (seed, seed block): the same draw
    assert grid.kept_case_ids(spec.replace(notes="x")) == kept


def test_another_seed_block_draws_other_cases() -> None:
    spec = tier_spec("standard").replace(case_share=0.25)
    draws = {grid.kept_case_ids(spec.replace(seed_block=b)) for b in range(4)}
    assert len(draws) == 4


@settings(max_examples=12, deadline=None)
@given(tier=st.sampled_from(("ci", "smoke")), share=shares, block=st.integers(0, 3))
def test_built_cases_are_the_full_tiers_own_every_drift_case_kept(tier: str, share: float,
                                                                  block: int) -> None:
    cal = calibrate(byte_count, PROBE_VOCAB)
    full_spec = tier_spec(tier, seed_block=block)
    spec = full_spec.replace(case_share=share)
    full = grid.build_cases(full_spec, PROBE_VOCAB, byte_count, cal, (4, 16))
    part = grid.build_cases(spec, PROBE_VOCAB, byte_count, cal, (4, 16))
    by_id = {c.case_id: c.to_dict() for c in full}
    # each kept case byte for byte the full tier's, in the full tier's order
    assert [c.case_id for c in part] == [c.case_id for c in full
                                         if c.case_id in {p.case_id for p in part}]
    assert all(by_id[c.case_id] == c.to_dict() for c in part)
    assert ({c.case_id for c in full if c.family == "drift"}
            <= {c.case_id for c in part})
    per = Counter((c.family, c.cell.length) for c in part if c.family != "drift")
    assert per == {k: cases_kept(n, share) for k, n in _strata(spec).items()}
    # arms and levels are assigned over the kept cases as the full tier assigns them
    conditions = {(c.case_id, arm, lv) for c, arm, lv in tasks_of(full_spec, full)}
    assert {(c.case_id, arm, lv) for c, arm, lv in tasks_of(spec, part)} == {
        t for t in conditions if t[0] in {c.case_id for c in part}}


def test_share_one_builds_todays_cases() -> None:
    cal = calibrate(byte_count, PROBE_VOCAB)
    spec = tier_spec("smoke")
    a = grid.build_cases(spec, PROBE_VOCAB, byte_count, cal, (4, 16))
    b = grid.build_cases(spec.replace(case_share=1.0), PROBE_VOCAB, byte_count, cal, (4, 16))
    assert [c.to_dict() for c in a] == [c.to_dict() for c in b]
    assert len(grid.build_cases(spec.replace(case_share=0.25), PROBE_VOCAB, byte_count, cal,
                                (4, 16))) < len(a)
