"""The probe's conversation formats, as functions of a `Vocabulary`.

Formats are regular and short, because the embedded model is tiny and byte-level and a training
generator reuses them (issue 7). A conversation is user turns of filler sentences with facts
planted among them, each user turn answered by the assistant with `ACK`, then a final question
whose expected answer is exactly the value:

    user: <filler> Remember: the code for amber falcon is 4817293. <filler>
    assistant: OK.
    ...
    user: What is the code for amber falcon?          → "4817293"

Families (content only; `probe/layout.py` places it at token lengths and depths):
- needle: one fact per key, 1 needle + `distractors` facts of the same type; optionally several
  keys asked at once (multi-query, answer "v1, v2").
- copy: the same, with a 24-64 character line instead of a 7-digit code.
- vartrack: `Remember: KOVAL = 48213.` then hops `Remember: BRINE = KOVAL.` in later positions
  (RULER vt); the question asks the last variable of the chain; a distractor chain has its own
  value.

Values can never be memorised. Every value a vocabulary draws has
`sum(map(ord, value)) % 2 == vocab.value_parity` (the last character is chosen to make it so).
The probe vocabulary uses parity 1; a training generator must use a vocabulary with parity 0, so
no probe value can ever appear in training data (`vocab.overlap()` checks this and the other
disjointness rules).
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from typing import Any

from dsv4bisect.probe.vocab import Vocabulary

ACK = "OK."
CODE_DIGITS = 7
VAR_DIGITS = 5
LINE_ALPHABET = string.ascii_lowercase + string.digits
LINE_GROUP = 5  # a '-' after every 5 characters: "k3v9q-2mx7t-pa4..."


def fact_text(key: str, value: str) -> str:
    return f"Remember: the code for {key} is {value}."


def line_text(key: str, line: str) -> str:
    return f"Remember: the line for {key} is {line}."


def assign_text(var: str, rhs: str) -> str:
    return f"Remember: {var} = {rhs}."


def code_question(keys: list[str]) -> str:
    if len(keys) == 1:
        return f"What is the code for {keys[0]}?"
    return f"What are the codes for {', '.join(keys[:-1])} and {keys[-1]}?"


def line_question(key: str) -> str:
    return f"What is the line for {key}?"


def var_question(var: str) -> str:
    return f"What is the value of {var}?"


def _fix_parity(prefix: str, alphabet: str, parity: int, rng: random.Random) -> str:
    """Append one character from `alphabet` so the whole string has the required parity."""
    need = (parity - sum(map(ord, prefix))) % 2
    choices = [ch for ch in alphabet if ord(ch) % 2 == need]
    return prefix + rng.choice(choices)


def draw_code(rng: random.Random, vocab: Vocabulary, digits: int = CODE_DIGITS) -> str:
    """A `digits`-digit code (leading digit non-zero) in the vocabulary's value class."""
    head = rng.choice("123456789") + "".join(rng.choice(string.digits) for _ in range(digits - 2))
    return _fix_parity(head, string.digits, vocab.value_parity, rng)


def draw_line(rng: random.Random, vocab: Vocabulary, n_chars: int) -> str:
    """An `n_chars` line of [a-z0-9] groups joined by '-', never ending in '-'."""
    chars: list[str] = []
    while len(chars) < n_chars - 1:
        if len(chars) % (LINE_GROUP + 1) == LINE_GROUP:
            chars.append("-")
        else:
            chars.append(rng.choice(LINE_ALPHABET))
    if chars and chars[-1] == "-":
        chars[-1] = rng.choice(LINE_ALPHABET)
    return _fix_parity("".join(chars), LINE_ALPHABET, vocab.value_parity, rng)


def value_class(value: str) -> int:
    """The parity class a value belongs to (probe: 1)."""
    return sum(map(ord, value)) % 2


@dataclass(frozen=True)
class Plant:
    """A sentence to place in the conversation at `depth` (fraction of prompt tokens)."""

    text: str
    depth: float
    role: str  # "needle" | "distractor" | "hop"


@dataclass(frozen=True)
class Content:
    """What a conversation must contain, before layout at a token length."""

    family: str
    plants: tuple[Plant, ...]
    question: str
    expected: str  # the exact answer
    values: tuple[str, ...]  # strings that must all appear in a correct answer
    meta: dict[str, Any] = field(default_factory=dict)


def _random_depths(rng: random.Random, n: int) -> list[float]:
    return [round(rng.uniform(0.02, 0.98), 4) for _ in range(n)]


def needle_content(rng: random.Random, vocab: Vocabulary, depth: float, *, distractors: int,
                   queries: int = 1) -> Content:
    """Multi-key needle: the needle at `depth`, distractor facts elsewhere."""
    keys = rng.sample(vocab.keys, 1 + distractors)
    values = [draw_code(rng, vocab) for _ in keys]
    while len(set(values)) < len(values):  # distinct values, so an answer names one key
        values = [draw_code(rng, vocab) for _ in keys]
    depths = [depth, *_random_depths(rng, distractors)]
    plants = tuple(Plant(fact_text(k, v), d, "needle" if i == 0 else "distractor")
                   for i, (k, v, d) in enumerate(zip(keys, values, depths)))
    asked = list(range(queries))
    expected = ", ".join(values[i] for i in asked)
    return Content("needle", plants, code_question([keys[i] for i in asked]), expected,
                   tuple(values[i] for i in asked), {"keys": [keys[i] for i in asked]})


def copy_content(rng: random.Random, vocab: Vocabulary, depth: float, *, distractors: int,
                 chars: tuple[int, int]) -> Content:
    """Exact long-string copy: a planted line at `depth` must come back character for character."""
    keys = rng.sample(vocab.keys, 1 + distractors)
    lines = [draw_line(rng, vocab, rng.randint(*chars)) for _ in keys]
    depths = [depth, *_random_depths(rng, distractors)]
    plants = tuple(Plant(line_text(k, s), d, "needle" if i == 0 else "distractor")
                   for i, (k, s, d) in enumerate(zip(keys, lines, depths)))
    return Content("copy", plants, line_question(keys[0]), lines[0], (lines[0],),
                   {"keys": [keys[0]]})


def vartrack_content(rng: random.Random, vocab: Vocabulary, depth: float, *, hops: int) -> Content:
    """A chain `A = value; B = A; ...` starting at `depth`, plus a distractor chain."""
    names = rng.sample(vocab.variables, 2 * (hops + 1))
    chain, other = names[: hops + 1], names[hops + 1:]
    value = draw_code(rng, vocab, VAR_DIGITS)
    decoy = draw_code(rng, vocab, VAR_DIGITS)
    while decoy == value:
        decoy = draw_code(rng, vocab, VAR_DIGITS)
    # Later hops sit after the value, evenly between `depth` and the end, so order is kept (at
    # depth >= 0.98 they share the value's depth; the layout keeps equal depths in chain order).
    step = max(0.0, 0.98 - depth) / (hops + 1)
    plants = [Plant(assign_text(chain[0], value), depth, "needle")]
    plants += [Plant(assign_text(chain[i], chain[i - 1]), round(depth + i * step, 4), "hop")
               for i in range(1, hops + 1)]
    decoy_depths = sorted(_random_depths(rng, hops + 1))
    plants += [Plant(assign_text(other[0], decoy), decoy_depths[0], "distractor")]
    plants += [Plant(assign_text(other[i], other[i - 1]), decoy_depths[i], "distractor")
               for i in range(1, hops + 1)]
    return Content("vartrack", tuple(plants), var_question(chain[-1]), value, (value,),
                   {"chain": chain})
