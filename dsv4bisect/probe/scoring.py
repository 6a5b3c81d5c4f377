"""Scoring one answer: correctness, closeness, and hard signatures.

- `correct`: every expected value appears verbatim in the answer (RULER's string_match_all,
  case-sensitive). A real model may wrap the value in a sentence; the tiny model answers bare.
- `exact`: the normalised answer (stripped of whitespace, wrapping quotes/backticks and one
  trailing period) equals the expected answer.
- `first_wrong_char`: index of the first character where the normalised answer departs from the
  expected one (None when exact); `edit_distance`: Levenshtein distance / max(len) in [0, 1].
- Hard signatures, which a numerically healthy model does not produce on these prompts:
  `empty` (nothing but whitespace), `garbage` (control characters, U+FFFD, reserved-token text or
  any non-ASCII letter — every prompt is ASCII), `repetition` (hit the token limit while repeating
  a unit of ≤ 16 characters ≥ 4 times over at least half the answer), `wrong_last_char` (a value
  comes back whole except its last character, the vllm#55927 signature: 8417 → 8411),
  `truncated` (the model ended the answer itself — finish reason `stop` — in the middle of a
  value: its last word is a proper, non-empty prefix of a value it did not give whole, after
  the expected answer's own beginning or a sentence without digits, as `kryrz-acmol-` for
  `kryrz-acmol-poqqd-9hry2-teup`; the false-EOS signature of speculative decoding,
  InferenceX PR #1631). A model that knows the value does not stop inside it.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

SIGNATURES = ("empty", "garbage", "repetition", "wrong_last_char", "truncated")
# Typographic punctuation a real model may use: ‘ ’ “ ” … nbsp – —
_ALLOWED_NON_ASCII = set("\u2018\u2019\u201c\u201d\u2026\u00a0\u2013\u2014")
THINK_END = "</think>"


@dataclass(frozen=True)
class Score:
    correct: bool
    exact: bool
    first_wrong_char: int | None
    edit_distance: float
    signatures: tuple[str, ...]


def answer_text(output: str) -> str:
    """The answer part of a completion: text after the last `</think>` when thinking leaked."""
    return output.rsplit(THINK_END, 1)[-1] if THINK_END in output else output


def normalise(text: str) -> str:
    """Strip whitespace, one trailing period and wrapping quotes/backticks (in any order)."""
    t = text.strip()
    t = t[:-1].rstrip() if t.endswith(".") else t
    while len(t) >= 2 and t[0] == t[-1] and t[0] in "`\"'":
        t = t[1:-1].strip()
    return t[:-1] if t.endswith(".") else t


def first_wrong_char(expected: str, got: str) -> int | None:
    for i, (a, b) in enumerate(zip(expected, got)):
        if a != b:
            return i
    return None if expected == got else min(len(expected), len(got))


def edit_distance(a: str, b: str) -> float:
    """Levenshtein distance normalised by the longer length (0 = equal, 1 = nothing shared)."""
    if a == b:
        return 0.0
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1] / max(len(a), len(b))


def is_garbage_char(ch: str) -> bool:
    if ch in "\n\t\r":
        return False
    if ch.isascii():
        return not ch.isprintable()
    if ch in _ALLOWED_NON_ASCII:
        return False
    return unicodedata.category(ch)[0] != "Z"  # any other non-ASCII: letters, U+FFFD, ...


def is_repetition(text: str, finish_reason: str | None) -> bool:
    """Runaway repetition: stopped by the token limit inside a short repeating unit."""
    if finish_reason != "length":
        return False
    t = text.rstrip()
    for period in range(1, 17):
        unit = t[-period:]
        if len(unit) < period:
            break
        reps = 1
        while t.endswith(unit * (reps + 1)):
            reps += 1
        if reps >= 4 and reps * period >= max(12, len(t) / 2):
            return True
    return False


def _glued(ch: str) -> bool:
    """A character that would make a value part of a longer one: `3116079` inside `31160797`
    is another code, `ab12-cd34` inside `ab12-cd34-ef` another line."""
    return ch.isalnum() or ch in "-_"


def contains_value(text: str, value: str) -> bool:
    """`value` appears in `text` as a whole: verbatim, not glued to a longer alphanumeric run."""
    start = text.find(value)
    while start >= 0:
        end = start + len(value)
        before = text[start - 1] if start else " "
        after = text[end] if end < len(text) else " "
        if not _glued(before) and not _glued(after):
            return True
        start = text.find(value, start + 1)
    return False


def has_wrong_last_char(value: str, text: str) -> bool:
    """`value` minus its last character appears, followed by a different alphanumeric."""
    if len(value) < 4 or value in text:
        return False
    head = value[:-1]
    start = text.find(head)
    while start >= 0:
        nxt = start + len(head)
        if nxt < len(text) and text[nxt].isalnum() and text[nxt] != value[-1]:
            return True
        start = text.find(head, start + 1)
    return False


def last_word(text: str) -> str:
    """The answer's final run of value characters (letters, digits, `-`, `_`), after the
    wrapping `normalise` strips (whitespace, quotes, a final period)."""
    t = normalise(text)
    start = len(t)
    while start > 0 and _glued(t[start - 1]):
        start -= 1
    return t[start:]


def is_truncated(values: tuple[str, ...], text: str, finish_reason: str | None,
                 expected: str | None = None) -> bool:
    """The model stopped itself inside a value: finish reason `stop`; the answer's last word is
    a proper, non-empty prefix of a value that does not appear whole in it; and what comes
    before that word is the expected answer's own beginning (a bare answer, `1234567, 76` of
    `1234567, 7654321`) or a sentence without digits (`The code is 48`). A wrong value (a
    distractor's code) is a whole other word, so it is not a prefix; a garbled answer whose
    last letter happens to begin the value (`lle090z, l`) has other text before it; an answer
    cut by the token limit is not a stop."""
    if finish_reason != "stop":
        return False
    t, word = normalise(text), last_word(text)
    if not word or not any(len(word) < len(v) and v.startswith(word)
                           and not contains_value(text, v) for v in values):
        return False
    lead = t[: len(t) - len(word)]
    whole = ", ".join(values) if expected is None else expected
    return whole.startswith(t) or not any(ch.isdigit() for ch in lead)


def signatures(output: str, values: tuple[str, ...], finish_reason: str | None,
               expected: str | None = None) -> tuple[str, ...]:
    found = []
    if not output.strip():
        found.append("empty")
    if any(is_garbage_char(ch) for ch in output) or "<\uff5c" in output:
        found.append("garbage")
    if is_repetition(output, finish_reason):
        found.append("repetition")
    if any(has_wrong_last_char(v, output) for v in values):
        found.append("wrong_last_char")
    if is_truncated(values, output, finish_reason, expected):
        found.append("truncated")
    return tuple(found)


def score(output: str, expected: str, values: tuple[str, ...],
          finish_reason: str | None = None) -> Score:
    """Score one answer against the expected answer and the values it must contain."""
    text = answer_text(output)
    got = normalise(text)
    return Score(
        correct=bool(values) and all(contains_value(text, v) for v in values),
        exact=got == expected,
        first_wrong_char=first_wrong_char(expected, got),
        edit_distance=round(edit_distance(expected, got), 4),
        signatures=signatures(text, values, finish_reason, expected),
    )
