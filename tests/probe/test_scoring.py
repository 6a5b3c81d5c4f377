"""Scoring one answer: correctness, closeness, hard signatures."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsv4bisect.probe.formats import LINE_ALPHABET, LINE_GROUP
from dsv4bisect.probe.scoring import edit_distance, first_wrong_char, score, signatures


def test_correct_exact_and_wrapped_answers() -> None:
    s = score("4817293", "4817293", ("4817293",))
    assert s.correct and s.exact and s.first_wrong_char is None and s.edit_distance == 0.0
    s = score("  `4817293`. ", "4817293", ("4817293",))
    assert s.correct and s.exact
    s = score("The code for amber falcon is 4817293.", "4817293", ("4817293",))
    assert s.correct and not s.exact and s.signatures == ()


def test_a_value_glued_to_more_characters_is_another_value() -> None:
    # A decoder that fails to stop after the value answers with a different, longer code.
    assert not score("31160797", "3116079", ("3116079",)).correct
    assert not score("x3116079", "3116079", ("3116079",)).correct
    assert not score("ab12c-dd34e-ef", "ab12c-dd34e", ("ab12c-dd34e",)).correct
    assert score("31160797 or 3116079", "3116079", ("3116079",)).correct  # one whole occurrence
    assert score("(3116079)", "3116079", ("3116079",)).correct
    assert score("codes: 1234567,7654321", "1234567, 7654321", ("1234567", "7654321")).correct


def test_multi_query_needs_every_value() -> None:
    assert score("1234567, 7654321", "1234567, 7654321", ("1234567", "7654321")).correct
    assert not score("1234567", "1234567, 7654321", ("1234567", "7654321")).correct


def test_wrong_last_character_is_a_hard_signature() -> None:
    # vllm#55927: the needle came back with only its last digit wrong (8417 -> 8411).
    s = score("8411", "8417", ("8417",))
    assert not s.correct and s.first_wrong_char == 3 and "wrong_last_char" in s.signatures
    line = "k3v9q-2mx7t-pa4zz-0c1de"
    s = score(line[:-1] + "x", line, (line,))
    assert s.signatures == ("wrong_last_char",) and s.first_wrong_char == len(line) - 1
    assert "wrong_last_char" not in score("841", "8417", ("8417",)).signatures  # truncated
    assert "wrong_last_char" not in score("9999", "8417", ("8417",)).signatures


def test_first_wrong_char_and_edit_distance() -> None:
    assert first_wrong_char("abcdef", "abXdef") == 2
    assert first_wrong_char("abc", "ab") == 2
    assert first_wrong_char("abc", "abcd") == 3
    assert edit_distance("kitten", "sitting") == pytest.approx(3 / 7)
    assert edit_distance("", "abc") == 1.0


@pytest.mark.parametrize(("text", "finish", "expected"), [
    ("", "stop", ("empty",)),
    ("   \n", "stop", ("empty",)),
    ("48172\ufffd93", "stop", ("garbage",)),
    ("4817293 漢字", "stop", ("garbage",)),
    ("код 4817293", "stop", ("garbage",)),
    ("<｜reserved_300｜>", "length", ("garbage",)),
    ("abc\x07", "stop", ("garbage",)),
    ("“4817293” – done…", "stop", ()),
    ("the the the the the the the the ", "length", ("repetition",)),
    ("7777777777777777", "length", ("repetition",)),
    ("7777777777777777", "stop", ()),  # stopped by itself: not runaway
    ("4817293", "length", ()),
])
def test_signatures(text: str, finish: str, expected: tuple[str, ...]) -> None:
    assert signatures(text, ("4817293",), finish) == expected


def test_thinking_text_is_not_the_answer() -> None:
    s = score("let me think 1111111</think>4817293", "4817293", ("4817293",))
    assert s.exact


# ---- `truncated`: the model stopped itself inside the value (false EOS, InferenceX PR #1631) ----

CODES = st.text("0123456789", min_size=5, max_size=7)
LINES = st.text(LINE_ALPHABET, min_size=24, max_size=64).map(
    lambda t: "-".join(t[i:i + LINE_GROUP] for i in range(0, len(t), LINE_GROUP)))


def test_the_measured_false_eos_answer_is_truncated() -> None:
    # The `draft-eos` fault's answer on the shipped checkpoint (docs/results/2026-12-02-cpu-spec).
    line = "kryrz-acmol-poqqd-9hry2-teup"
    s = score("kryrz-acmol-", line, (line,), "stop")
    assert not s.correct and s.signatures == ("truncated",)
    assert score("244927", "2449273", ("2449273",), "stop").signatures == ("truncated",)


@given(value=st.one_of(CODES, LINES), data=st.data())
def test_a_proper_prefix_that_stopped_is_truncated(value: str, data: st.DataObject) -> None:
    cut = data.draw(st.integers(1, len(value) - 1))
    wrap = data.draw(st.sampled_from(["{}", " {}\n", "`{}`", "{}.", "The code is {}."]))
    text = wrap.format(value[:cut])
    assert "truncated" in signatures(text, (value,), "stop")
    # The token limit cut it (a budget too small), not the model: not this signature.
    assert "truncated" not in signatures(text, (value,), "length")


@given(value=st.one_of(CODES, LINES), other=st.one_of(CODES, LINES))
def test_a_whole_value_is_never_truncated(value: str, other: str) -> None:
    for text in (value, f"{value}.", f"The code is {value}.", f"{other}, {value}"):
        assert "truncated" not in signatures(text, (value,), "stop")
    if not value.startswith(other):  # a wrong whole value (a distractor's) is a wrong answer
        assert "truncated" not in signatures(other, (value,), "stop")


def test_truncation_edges() -> None:
    assert "truncated" not in signatures("", ("4817293",), "stop")  # that is `empty`
    assert "truncated" not in signatures("4817", ("4817293",), None)  # no finish reason known
    assert "truncated" not in signatures("48172934", ("4817293",), "stop")  # longer: other value
    assert "truncated" not in signatures("4817x", ("4817293",), "stop")
    # Multi-query: stopping inside the second value is truncation; giving only the first
    # value whole is a wrong answer, not a cut one.
    values = ("1234567", "7654321")
    assert "truncated" in signatures("1234567, 765", values, "stop")
    assert "truncated" not in signatures("1234567", values, "stop")
    # A garbled answer whose last letter happens to begin the value is not a cut value (seen
    # with the concurrency fault `mma-decode:batch-kv-slot`); a sentence without digits is.
    line = "leveb-cxsdp-8puct-lgao9-h9zz"
    assert "truncated" not in signatures("lle090z, l", (line,), "stop", line)
    assert "truncated" in signatures("The line for amber falcon is leveb-cx", (line,), "stop")
    assert "truncated" not in signatures("8 of them: leveb-cx", (line,), "stop")
    # The answer after a leaked </think> is what is scored.
    assert score("4817293 is it</think>481", "4817293", ("4817293",),
                 "stop").signatures == ("truncated",)
