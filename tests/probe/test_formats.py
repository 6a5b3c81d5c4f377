"""Formats and vocabularies: value classes, disjointness, determinism of case content."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from dsv4bisect.probe import formats
from dsv4bisect.probe.vocab import PROBE_VOCAB, Vocabulary, overlap


def _training_vocab() -> Vocabulary:
    return Vocabulary(name="train", adjectives=("red", "blue", "green", "small"),
                      nouns=("cup", "door", "road", "tree"),
                      variables=tuple(f"V{c}AAA" for c in "ABCDEFGH"),
                      filler=("Water is wet.",), value_parity=0)


@given(st.integers(0, 2**32))
def test_every_probe_value_is_in_the_probe_class(seed: int) -> None:
    rng = random.Random(seed)
    code = formats.draw_code(rng, PROBE_VOCAB)
    line = formats.draw_line(rng, PROBE_VOCAB, rng.randint(24, 64))
    assert len(code) == 7 and code.isdigit() and code[0] != "0"
    assert formats.value_class(code) == formats.value_class(line) == 1
    assert not line.endswith("-") and set(line) <= set(formats.LINE_ALPHABET + "-")


@given(st.integers(0, 2**32))
def test_training_vocab_draws_never_collide_with_probe_values(seed: int) -> None:
    train = _training_vocab()
    rng = random.Random(seed)
    assert formats.value_class(formats.draw_code(rng, train)) == 0


def test_overlap_reports_shared_words_and_parity() -> None:
    assert overlap(PROBE_VOCAB, _training_vocab()) == []
    clash = overlap(PROBE_VOCAB, PROBE_VOCAB)
    assert any(s.startswith("key: ") for s in clash) and clash[-1].startswith("value parity")


def test_needle_content_is_deterministic_and_well_formed() -> None:
    a = formats.needle_content(random.Random(5), PROBE_VOCAB, 0.5, distractors=3, queries=2)
    b = formats.needle_content(random.Random(5), PROBE_VOCAB, 0.5, distractors=3, queries=2)
    assert a == b
    assert len(a.plants) == 4 and a.plants[0].role == "needle" and a.plants[0].depth == 0.5
    assert a.question.startswith("What are the codes for ") and a.expected == ", ".join(a.values)
    assert all(v in " ".join(p.text for p in a.plants) for v in a.values)


def test_vartrack_chain_is_ordered_and_resolves_to_the_value() -> None:
    c = formats.vartrack_content(random.Random(1), PROBE_VOCAB, 0.2, hops=3)
    chain = [p for p in c.plants if p.role in ("needle", "hop")]
    assert [p.depth for p in chain] == sorted(p.depth for p in chain)
    # Follow the chain from the asked variable back to a value.
    assigns = dict(p.text[len("Remember: "):-1].split(" = ") for p in c.plants)
    var = c.question.removeprefix("What is the value of ").removesuffix("?")
    while not assigns[var].isdigit():
        var = assigns[var]
    assert assigns[var] == c.expected and len(c.expected) == 5


def test_copy_content_lengths() -> None:
    c = formats.copy_content(random.Random(3), PROBE_VOCAB, 0.9, distractors=2, chars=(24, 24))
    assert len(c.expected) == 24 and c.plants[0].text.endswith(c.expected + ".")
