"""The rule by which the bad end's look-1 verdict settles a block's ends (bisect/end_looks.py
`settles`) and the specs of the two looks (`look_spec`)."""

from __future__ import annotations

import pytest

from dsv4bisect.bisect import end_looks as L
from dsv4bisect.bisect.trials.ends_book import read_settled, write_settled
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe import verdict as V
from dsv4bisect.probe.grid import accuracy_answers, kept_case_ids
from dsv4bisect.probe.spec import tier_spec


def _verdict(word: str, *, overall_p: float | None = None, cells: tuple[float, ...] = (),
             hard: bool = False, drift: str = "pass", lost: int = 0,
             gained: int = 0) -> V.Verdict:
    """A bad end's verdict as the probe's judge writes it: the overall McNemar p, each failed
    cell's Holm p, hard signatures, the drift status, the answers lost and gained."""
    return V.Verdict(
        word, ("by hand",), {}, overall={"p_value": overall_p, "b": lost, "c": gained},
        cells=tuple(V.CellResult(f"needle/L256/d0.5/t2#{k}", "cold", 20, 8, 0, p, p, True)
                    for k, p in enumerate(cells)),
        signatures={"hard_fail": hard}, drift={"status": drift})


@pytest.mark.parametrize("verdict, why", [
    # facts lost at half the probe's error rate: settled
    (_verdict(V.FAIL, overall_p=V.ALPHA_OVERALL / 2), "accuracy"),
    (_verdict(V.FAIL, overall_p=0.2, cells=(V.ALPHA_CELL / 2,)), "accuracy"),
    # a FAIL between the two rates: the full look decides
    (_verdict(V.FAIL, overall_p=V.ALPHA_OVERALL * 0.8), None),
    (_verdict(V.FAIL, overall_p=0.2, cells=(V.ALPHA_CELL * 0.8,)), None),
    # hard signatures, or a FAIL no count decides (a crash, a non-finite output)
    (_verdict(V.FAIL, overall_p=0.9, hard=True), "signatures"),
    (_verdict(V.FAIL, overall_p=0.9), "other"),
    (_verdict(V.FAIL), "other"),
    # a WARN is a claim that no fact is lost: like a PASS, only on the whole evidence, whether
    # look 1 lost nothing (draft-eos on smoke: its truncations are in the other cases) or
    # lost answers short of establishing it (swa-ring-stale on smoke: 4 of 36, p = 0.06)
    (_verdict(V.WARN, overall_p=1.0, drift="warn"), None),
    (_verdict(V.WARN, overall_p=0.0625, drift="warn", lost=4), None),
    # a PASS is said only on the whole evidence
    (_verdict(V.PASS, overall_p=0.9), None),
    (_verdict(V.CANNOT_TEST), None),
])
def test_settles(verdict: V.Verdict, why: str | None) -> None:
    assert L.settles(verdict) == why


def test_look_1_is_a_share_of_the_tier_unless_it_keeps_every_case() -> None:
    smoke = tier_spec("smoke", seed_block=2)
    one, two = L.look_spec(smoke, 1), L.look_spec(smoke, 2)
    assert two == smoke and one.case_share == L.LOOK1_MAX_SHARE and one.seed_block == 2
    assert kept_case_ids(one) is not None and not L.single_look(smoke)
    ci = tier_spec("ci")  # one case per (family, length): look 1 is the whole tier
    assert L.single_look(ci) and L.look_spec(ci, 1) == ci
    assert L.look_spec(ci, 1).spec_hash() == ci.spec_hash()


def test_look_1_is_the_smallest_share_that_settles_the_smallest_loss() -> None:
    standard = tier_spec("standard")
    share = L.look1_share(standard)
    assert share < L.LOOK1_MAX_SHARE  # the standard tier has answers to spare at a quarter
    answers = accuracy_answers(standard.replace(case_share=share))
    assert L.look2_chance(answers) <= L.LOOK2_RISK
    smaller = accuracy_answers(standard.replace(case_share=share - 0.01))
    assert L.look2_chance(smaller) > L.LOOK2_RISK  # a step less would not
    # the same share for every seed block and the plan: a function of the grid's shape
    assert L.look1_share(standard.replace(seed_block=5)) == share
    assert L.look_spec(standard.replace(seed_block=5), 1).case_share == share
    # smoke cannot settle the smallest loss even whole (96 answers): look 1 stays a quarter
    smoke = tier_spec("smoke")
    assert L.look2_chance(accuracy_answers(smoke)) > L.LOOK2_RISK
    assert L.look1_share(smoke) == L.LOOK1_MAX_SHARE


def test_look2_chance_falls_with_the_answers_and_a_settling_count_settles() -> None:
    chances = [L.look2_chance(n) for n in (32, 96, 168, 588)]
    assert chances == sorted(chances, reverse=True) and chances[0] > 0.5 > chances[-1]
    least = next(b for b in range(60) if L.settled(b, 168))
    assert not L.settled(least - 1, 168)
    assert L.settles(V.Verdict(V.FAIL, (), {}, overall={"n": 168, "b": least, "c": 0,
                                                         "p_value": 0.5 ** least})) == "accuracy"


def test_the_settled_look_is_read_back_and_a_broken_record_is_refused(tmp_path) -> None:
    assert read_settled(tmp_path, 0) is None  # not settled: its bad end's trial runs again
    write_settled(tmp_path, 0, 1, "accuracy")
    write_settled(tmp_path, 3, 2, None)
    assert read_settled(tmp_path, 0) == (1, "accuracy")
    assert read_settled(tmp_path, 3) == (2, None)
    (tmp_path / "b3" / "settled.json").write_text('{"look": 7}')
    with pytest.raises(ConfigError, match="names no look"):
        read_settled(tmp_path, 3)
