"""Seeded synthetic multi-turn conversations for training the embedded checkpoint.

The conversations use the probe's formats (`dsv4bisect.probe.formats`: facts, lines, variable
assignments, questions, the assistant's "OK." acknowledgement) with the training vocabulary,
which shares no key, variable, filler sentence or value with the probe's. Facts, copy lines and
variable chains are planted at every depth; questions about any earlier plant are asked all
along the conversation (not only at the end), so every few hundred tokens carries a supervised
long-range answer. The layout follows the chat template, so the loss weights come from it:
answer tokens (after `<｜Assistant｜></think>`, up to and including eos) weigh `ANSWER`,
acknowledgements `ACK_W`, everything else `CONTEXT` (plain next-token prediction on the
conversation, which repeats filler sentences and so rewards copying from context).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from dsv4bisect.probe import formats as fmt
from dsv4bisect.probe.vocab import Vocabulary
from dsv4bisect.reference.chat import ChatMessage, apply_chat_template
from dsv4bisect.reference.tokenizer import EOS_ID, THINK_END_ID, ByteTokenizer
from dsv4bisect.reference.training.vocab import TRAIN_VOCAB

ANSWER, ACK_W, CONTEXT = 1.0, 0.05, 0.1
_TOK = ByteTokenizer()
_ACK_IDS = _TOK.encode(fmt.ACK)


@dataclass(frozen=True)
class Mix:
    """How a conversation is built (probabilities per step of the generator)."""

    question: float = 0.35  # a turn is a question about an earlier plant
    plant: float = 0.35  # a filler slot holds a plant instead
    kinds: tuple[tuple[str, float], ...] = (("code", 0.55), ("line", 0.2), ("var", 0.25))
    multi_query: float = 0.15  # a code question asks two keys
    line_chars: tuple[int, int] = (12, 48)
    max_sentences: int = 6


# The difficulty stages of the curriculum (train.py): codes only first — one kind of value, no
# chains, no two-key questions — so that exact copying through the compressed entries forms
# before the full mix (docs/training.md: on the shipped layout the first exact copies need
# ~450 steps even on the easiest task); then codes and copy lines; then everything.
MIXES = {"codes": Mix(kinds=(("code", 1.0),), multi_query=0.0),
         "copy": Mix(kinds=(("code", 0.6), ("line", 0.4)), multi_query=0.0),
         "full": Mix()}


@dataclass(frozen=True)
class Sample:
    ids: list[int]
    weights: list[float]  # weights[i]: weight of predicting ids[i] from ids[:i] (weights[0] = 0)
    questions: int


@dataclass
class _State:
    codes: dict[str, str] = field(default_factory=dict)  # key -> 7-digit code
    lines: dict[str, str] = field(default_factory=dict)  # key -> line
    vars: dict[str, str] = field(default_factory=dict)  # variable -> its value (chains resolved)
    free_keys: list[str] = field(default_factory=list)
    free_vars: list[str] = field(default_factory=list)


def _plant(rng: random.Random, vocab: Vocabulary, st: _State, mix: Mix) -> str | None:
    kind = rng.choices([k for k, _ in mix.kinds], [w for _, w in mix.kinds])[0]
    if kind == "code" and st.free_keys:
        key = st.free_keys.pop()
        st.codes[key] = fmt.draw_code(rng, vocab)
        return fmt.fact_text(key, st.codes[key])
    if kind == "line" and st.free_keys:
        key = st.free_keys.pop()
        st.lines[key] = fmt.draw_line(rng, vocab, rng.randint(*mix.line_chars))
        return fmt.line_text(key, st.lines[key])
    if kind == "var" and st.free_vars:
        var = st.free_vars.pop()
        if st.vars and rng.random() < 0.6:  # a hop: the new variable copies an existing one
            src = rng.choice(sorted(st.vars))
            st.vars[var] = st.vars[src]
            return fmt.assign_text(var, src)
        st.vars[var] = fmt.draw_code(rng, vocab, fmt.VAR_DIGITS)
        return fmt.assign_text(var, st.vars[var])
    return None


def _question(rng: random.Random, st: _State, mix: Mix) -> tuple[str, str] | None:
    options = [k for k, pool in (("code", st.codes), ("line", st.lines), ("var", st.vars)) if pool]
    if not options:
        return None
    kind = rng.choice(options)
    if kind == "code":
        n = 2 if len(st.codes) > 1 and rng.random() < mix.multi_query else 1
        keys = rng.sample(sorted(st.codes), n)
        return fmt.code_question(keys), ", ".join(st.codes[k] for k in keys)
    if kind == "line":
        key = rng.choice(sorted(st.lines))
        return fmt.line_question(key), st.lines[key]
    var = rng.choice(sorted(st.vars))
    return fmt.var_question(var), st.vars[var]


def _user_turn(rng: random.Random, vocab: Vocabulary, st: _State, mix: Mix) -> str:
    parts = []
    for _ in range(rng.randint(1, mix.max_sentences)):
        planted = _plant(rng, vocab, st, mix) if rng.random() < mix.plant else None
        parts.append(planted or rng.choice(vocab.filler))
    return " ".join(parts)


def conversation(rng: random.Random, target_tokens: int, *, vocab: Vocabulary = TRAIN_VOCAB,
                 mix: Mix = Mix()) -> list[ChatMessage]:
    """Messages of about `target_tokens` byte tokens, ending with a question and its answer."""
    st = _State(free_keys=rng.sample(vocab.keys, len(vocab.keys)),
                free_vars=rng.sample(vocab.variables, len(vocab.variables)))
    messages: list[ChatMessage] = []
    used = 1  # bos
    reserve = 120  # room for the final question and answer
    while used < target_tokens - reserve:
        qa = _question(rng, st, mix) if rng.random() < mix.question else None
        user, answer = qa if qa else (_user_turn(rng, vocab, st, mix), fmt.ACK)
        messages += [ChatMessage("user", user), ChatMessage("assistant", answer)]
        used += len(user) + len(answer) + 4  # User, Assistant, </think>, eos
    final = _question(rng, st, mix)
    if final is None:  # nothing planted yet (very short target): plant one fact and ask it
        key = st.free_keys.pop()
        st.codes[key] = fmt.draw_code(rng, vocab)
        messages += [ChatMessage("user", fmt.fact_text(key, st.codes[key])),
                     ChatMessage("assistant", fmt.ACK)]
        final = _question(rng, st, mix)
        assert final is not None
    messages += [ChatMessage("user", final[0]), ChatMessage("assistant", final[1])]
    return messages


def weights_for(ids: list[int]) -> tuple[list[float], int]:
    """Per-token loss weights from the chat layout, and the number of supervised answers."""
    weights = [CONTEXT] * len(ids)
    weights[0] = 0.0
    questions, i = 0, 0
    while i < len(ids):
        if ids[i] != THINK_END_ID:
            i += 1
            continue
        end = ids.index(EOS_ID, i + 1)
        span = ids[i + 1 : end]
        w = ACK_W if span == _ACK_IDS else ANSWER
        questions += w == ANSWER
        for j in range(i + 1, end + 1):
            weights[j] = w
        i = end + 1
    return weights, questions


def sample(rng: random.Random, target_tokens: int, *, vocab: Vocabulary = TRAIN_VOCAB,
           mix: Mix = Mix()) -> Sample:
    ids = apply_chat_template(conversation(rng, target_tokens, vocab=vocab, mix=mix),
                              add_generation_prompt=False)
    weights, questions = weights_for(ids)
    return Sample(ids, weights, questions)
