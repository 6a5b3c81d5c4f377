"""Length fitting and the grid: exact lengths in the server's tokens, jitter, determinism.

The counters here are real tokenizers: the embedded engine's byte-level chat template (what the
embedded server counts) and a small word-level tokenizer that merges ".." pairs, to exercise the
fitter on a tokenizer where a pad unit is not always one token.
"""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dsv4bisect.errors import ProbeError
from dsv4bisect.probe import formats, grid
from dsv4bisect.probe.layout import _turns_with_filler, calibrate, fit_pad, layout
from dsv4bisect.probe.spec import tier_spec
from dsv4bisect.probe.vocab import PROBE_VOCAB
from dsv4bisect.reference.chat import apply_chat_template


def byte_count(messages: list[dict[str, str]]) -> int:
    return len(apply_chat_template(messages))


_WORDISH = re.compile(r"\.\.|\w+|[^\w\s]|\s")


def word_count(messages: list[dict[str, str]]) -> int:
    return 3 + sum(2 + len(_WORDISH.findall(m["content"])) for m in messages)


def test_calibration_is_exact_for_the_byte_tokenizer() -> None:
    cal = calibrate(byte_count, PROBE_VOCAB)
    assert cal.per_char == 1.0
    msgs = [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "OK."},
            {"role": "user", "content": "What?"}]
    assert cal.estimate(msgs) == pytest.approx(byte_count(msgs), abs=1)


@pytest.mark.parametrize("counter", [byte_count, word_count])
@pytest.mark.parametrize(("target", "turns", "depth"), [(512, 4, 0.5), (777, 1, 0.1),
                                                         (2047, 8, 0.9), (300, 2, 0.0)])
def test_layout_hits_the_target_exactly(counter, target: int, turns: int, depth: float) -> None:
    cal = calibrate(counter, PROBE_VOCAB)
    rng = random.Random(target)
    content = formats.needle_content(rng, PROBE_VOCAB, depth, distractors=2)
    lay = layout(content, turns=turns, target=target, rng=rng, vocab=PROBE_VOCAB, calib=cal,
                 count=counter)
    assert lay.prompt_tokens == target == counter(list(lay.messages))
    assert len(lay.messages) == 2 * turns + 1
    assert [m["role"] for m in lay.messages[-2:]] == ["assistant", "user"]
    assert lay.messages[-1]["content"] == content.question
    text = " ".join(m["content"] for m in lay.messages)
    assert all(p.text in text for p in content.plants)
    if counter is byte_count and target > 500:
        assert abs(lay.needle_depth - depth) < 0.06


def test_format_that_cannot_fit_is_a_clear_error() -> None:
    cal = calibrate(byte_count, PROBE_VOCAB)
    content = formats.needle_content(random.Random(0), PROBE_VOCAB, 0.5, distractors=3)
    with pytest.raises(ProbeError, match="does not fit"):
        layout(content, turns=8, target=200, rng=random.Random(0), vocab=PROBE_VOCAB,
               calib=cal, count=byte_count)


def test_fit_pad_on_a_merging_tokenizer() -> None:
    # Pad units merge in pairs: k units cost ceil(k/2) tokens; every target is reachable.
    for target in range(100, 140):
        k, n = fit_pad(lambda k: 100 + (k + 1) // 2, 100, target)
        assert n == target and 100 + (k + 1) // 2 == target


def test_jitter_covers_all_residues_mod_4_around_block_edges() -> None:
    assert grid.jitter_offsets((4, 16), 4) == [0, -1, -2, 1]
    assert {o % 4 for o in grid.jitter_offsets((4, 128), 4)} == {0, 1, 2, 3}
    eight = grid.jitter_offsets((0, 4, 128), 8)
    assert eight[4:] == [64, 63, 62, 65] and len(set(eight)) == 8
    assert grid.block_size((0, 0, 4, 16, 4, 16)) == 16 and grid.block_size(()) == 128
    assert grid.base_length(2048, (4, 128)) == 2048 and grid.base_length(300, (4, 128)) == 300
    assert grid.base_length(1010, (4, 16)) == 1008


def test_the_grid_steps_around_the_reported_window_and_ratios() -> None:
    # SGLang (ratios 4/128, window 128): the block stays 128; the tiny model (4/16, window 32):
    # 32, so the window edge and both compression block edges are anchors of the jitter
    sglang, tiny = grid.periods((0, 4, 128), 128), grid.periods((0, 0, 4, 16), 32)
    assert grid.block_size(sglang) == 128 and grid.block_size(tiny) == 32
    assert grid.periods(None, None) == (4, 128, 128)
    eight = grid.jitter_offsets(tiny, 8)
    assert eight[:4] == [0, -1, -2, 1] and eight[4:] == [16, 15, 14, 17]
    assert grid.base_length(1010, tiny) == 1024


def test_same_spec_and_block_give_byte_identical_cases() -> None:
    spec = tier_spec("ci").replace(cases_per_cell=4)
    cal = calibrate(byte_count, PROBE_VOCAB)
    a = grid.build_cases(spec, PROBE_VOCAB, byte_count, cal, (4, 16))
    b = grid.build_cases(spec, PROBE_VOCAB, byte_count, cal, (4, 16))
    assert [c.to_dict() for c in a] == [c.to_dict() for c in b]
    assert all(c.prompt_tokens == c.target for c in a)
    other = grid.build_cases(spec.replace(seed_block=1), PROBE_VOCAB, byte_count, cal, (4, 16))
    assert [c.expected for c in other] != [c.expected for c in a]
    residues = {c.target % 4 for c in a if c.family == "needle"}
    assert residues == {0, 1, 2, 3}
    assert grid.Case.from_dict(a[0].to_dict()) == a[0]


def test_lengths_filter_keeps_seeds_and_offsets() -> None:
    spec = tier_spec("ci")
    cal = calibrate(byte_count, PROBE_VOCAB)
    full = grid.build_cases(spec, PROBE_VOCAB, byte_count, cal, (4, 16))
    part = grid.build_cases(spec, PROBE_VOCAB, byte_count, cal, (4, 16), lengths=[1024])
    by_id = {c.case_id: c for c in full}
    assert part and all(by_id[c.case_id] == c for c in part)


@settings(max_examples=40, deadline=None)
@given(target=st.integers(300, 3000), turns=st.integers(1, 6), depth=st.floats(0.0, 1.0),
       seed=st.integers(0, 2**31), family=st.sampled_from(["needle", "copy", "vartrack"]))
def test_any_target_is_hit_exactly(target: int, turns: int, depth: float, seed: int,
                                   family: str) -> None:
    cal = calibrate(byte_count, PROBE_VOCAB)
    rng = random.Random(seed)
    if family == "needle":
        content = formats.needle_content(rng, PROBE_VOCAB, depth, distractors=1)
    elif family == "copy":
        content = formats.copy_content(rng, PROBE_VOCAB, depth, distractors=1, chars=(24, 48))
    else:
        content = formats.vartrack_content(rng, PROBE_VOCAB, depth, hops=2)
    try:
        lay = layout(content, turns=turns, target=target, rng=rng, vocab=PROBE_VOCAB,
                     calib=cal, count=byte_count)
    except ProbeError:
        assume(False)  # too short for this many turns: a clear error, tested above
        return
    assert byte_count(list(lay.messages)) == target
    text = " ".join(m["content"] for m in lay.messages)
    positions = [text.index(p.text) for p in content.plants if p.role != "distractor"]
    assert positions == sorted(positions)  # needle / chain order survives the layout


@pytest.mark.parametrize("depth", [0.98, 0.99, 1.0])
def test_a_variable_chain_planted_at_the_very_end_keeps_its_order(depth: float) -> None:
    """Found by the property test above: at depth > 0.98 the hops went before the value."""
    cal = calibrate(byte_count, PROBE_VOCAB)
    rng = random.Random(0)
    content = formats.vartrack_content(rng, PROBE_VOCAB, depth, hops=2)
    lay = layout(content, turns=1, target=300, rng=rng, vocab=PROBE_VOCAB, calib=cal,
                 count=byte_count)
    text = " ".join(m["content"] for m in lay.messages)
    positions = [text.index(p.text) for p in content.plants if p.role != "distractor"]
    assert positions == sorted(positions)


@pytest.mark.parametrize("tier", ["ci", "smoke"])
def test_every_seed_block_of_the_short_tiers_fits(tier: str) -> None:
    """Issue 31: at seed block 2 (and 5) of the smoke tier a draw of long filler sentences left
    a 3-turn copy (vartrack) conversation at 256 tokens with an empty turn, so every re-test
    at that block was CANNOT_TEST. Each block must lay out, with text in every user turn."""
    cal = calibrate(byte_count, PROBE_VOCAB)
    for block in range(8):
        spec = tier_spec(tier, seed_block=block)
        cases = grid.build_cases(spec, PROBE_VOCAB, byte_count, cal, (4, 128))
        assert cases and all(c.prompt_tokens == c.target for c in cases)
        for case in cases:
            users = [m["content"] for m in case.messages if m["role"] == "user"][:-1]
            assert len(users) == case.cell.turns and all(u.strip() for u in users), case.case_id


def test_the_redraw_keeps_room_for_every_turn_and_changes_only_draws_that_did_not_fit() -> None:
    """The case of the report: smoke, block 2, copy at depth 0.1 and 256 tokens. The first draw
    leaves the third turn empty; the redraw (same random state) gives every turn a sentence.
    A draw that fits is not redrawn: its case equals the plain first draw."""
    spec = tier_spec("smoke", seed_block=2)
    cal = calibrate(byte_count, PROBE_VOCAB)
    cell = grid.Cell("copy", 256, 0.1, 3)
    rng = random.Random(grid.case_seed(spec, cell, 0))
    content = grid._content(spec, PROBE_VOCAB, cell, rng)
    state = rng.getstate()
    first = _turns_with_filler(rng, PROBE_VOCAB, content, 3, 256, cal)
    assert any(not turn for turn in first)  # what made the old layout give up
    rng.setstate(state)
    lay = layout(content, turns=3, target=256, rng=rng, vocab=PROBE_VOCAB, calib=cal,
                 count=byte_count)
    assert byte_count(list(lay.messages)) == 256
    assert all(m["content"].strip() for m in lay.messages)

    fits = grid.Cell("needle", 256, 0.5, 3)  # block 2's needle case fits on the first draw
    rng = random.Random(grid.case_seed(spec, fits, 0))
    content = grid._content(spec, PROBE_VOCAB, fits, rng)
    state = rng.getstate()
    plain = _turns_with_filler(rng, PROBE_VOCAB, content, 3, 256, cal)
    assert all(plain)
    rng.setstate(state)
    lay = layout(content, turns=3, target=256, rng=rng, vocab=PROBE_VOCAB, calib=cal,
                 count=byte_count)
    text = " ".join(m["content"] for m in lay.messages)
    assert all(s in text for turn in plain for s in turn)
