"""Scoring one answer: correctness, closeness, hard signatures."""

from __future__ import annotations

import pytest

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
