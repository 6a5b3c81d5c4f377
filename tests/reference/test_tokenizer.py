"""The byte-level tokenizer and the DeepSeek-V4 chat template (no torch)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsv4bisect.errors import ConfigError
from dsv4bisect.reference.chat import (
    ChatFormatError,
    ChatMessage,
    apply_chat_template,
    normalize_messages,
    render_chat_text,
)
from dsv4bisect.reference.tokenizer import (
    ASSISTANT_ID,
    BOS_ID,
    BYTE_OFFSET,
    EOS_ID,
    N_TOKENS,
    THINK_END_ID,
    USER_ID,
    ByteTokenizer,
)

TOK = ByteTokenizer()


@given(st.text())
def test_any_text_round_trips_and_is_one_token_per_byte(text: str) -> None:
    ids = TOK.encode(text)
    assert len(ids) == len(text.encode("utf-8"))
    assert all(BYTE_OFFSET <= i < N_TOKENS for i in ids)
    assert TOK.decode(ids) == text
    assert TOK.decode(TOK.encode(text, add_bos=True), skip_special_tokens=True) == text


def test_fixed_layout_that_the_probe_and_training_data_rely_on() -> None:
    assert (TOK.bos_id, TOK.eos_id) == (0, 1)
    assert TOK.encode("A") == [16 + 65]
    assert TOK.encode("é") == [16 + 0xC3, 16 + 0xA9]
    assert TOK.encode("hi", add_bos=True) == [0, 16 + 104, 16 + 105]
    assert TOK.decode([0, 2, 3, 4, 5, 1]) == (
        "<｜begin▁of▁sentence｜><｜User｜><｜Assistant｜><think></think><｜end▁of▁sentence｜>"
    )


def test_typed_special_token_text_stays_bytes() -> None:
    ids = TOK.encode("<｜User｜></think>")
    assert USER_ID not in ids and THINK_END_ID not in ids
    assert TOK.decode(ids) == "<｜User｜></think>"


@given(st.binary())
def test_decode_never_fails_on_partial_utf8(data: bytes) -> None:
    ids = [b + BYTE_OFFSET for b in data]
    assert TOK.decode(ids) == data.decode("utf-8", errors="replace")


def test_partial_character_decodes_to_replacement_and_token_bytes_are_exact() -> None:
    first, second = TOK.encode("é")
    assert TOK.token_text(first) == "\ufffd"
    assert TOK.token_bytes(first) + TOK.token_bytes(second) == "é".encode()
    assert TOK.token_bytes(EOS_ID) == "<｜end▁of▁sentence｜>".encode()


def test_reserved_ids_decode_and_skip() -> None:
    assert TOK.decode([300]) == "<｜reserved_300｜>"
    assert TOK.decode([16 + 97, 300, 1, 16 + 98], skip_special_tokens=True) == "ab"
    assert TOK.is_special(300) and TOK.is_special(EOS_ID) and not TOK.is_special(16)


def test_out_of_range_ids_and_small_vocab_are_errors() -> None:
    with pytest.raises(ValueError, match="512"):
        TOK.decode([512])
    with pytest.raises(ValueError):
        TOK.decode([-1])
    with pytest.raises(ConfigError):
        ByteTokenizer(vocab_size=100)


def test_lone_surrogate_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        TOK.encode("\ud800")


def _b(text: str) -> list[int]:
    return TOK.encode(text)


def test_chat_layout_single_turn() -> None:
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert apply_chat_template(msgs) == [BOS_ID, *_b("S"), USER_ID, *_b("Q"), ASSISTANT_ID,
                                         THINK_END_ID]
    assert render_chat_text(msgs) == (
        "<｜begin▁of▁sentence｜>S<｜User｜>Q<｜Assistant｜></think>"
    )
    assert apply_chat_template(msgs, add_generation_prompt=False) == [BOS_ID, *_b("S"), USER_ID,
                                                                      *_b("Q")]


def test_chat_layout_multi_turn_and_training_sequence() -> None:
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d"},
    ]
    expected_text = (
        "<｜begin▁of▁sentence｜><｜User｜>a<｜Assistant｜></think>b<｜end▁of▁sentence｜>"
        "<｜User｜>c<｜Assistant｜></think>d<｜end▁of▁sentence｜>"
    )
    assert render_chat_text(msgs, add_generation_prompt=False) == expected_text
    ids = apply_chat_template(msgs, add_generation_prompt=False)
    assert TOK.decode(ids) == expected_text
    # A prompt plus its answer is a prefix of the full conversation (the probe relies on it).
    prompt = apply_chat_template(msgs[:3])
    assert ids[: len(prompt)] == prompt
    assert TOK.decode(ids[len(prompt):]) == "d<｜end▁of▁sentence｜>"


def test_consecutive_user_turns_and_continue_final() -> None:
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert render_chat_text(msgs) == (
        "<｜begin▁of▁sentence｜><｜User｜>a<｜User｜>b<｜Assistant｜></think>"
    )
    partial = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "half"}]
    assert render_chat_text(partial, continue_final=True).endswith("</think>half")


def test_message_normalization() -> None:
    msgs = normalize_messages([
        {"role": "USER", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
        {"role": "assistant", "content": None, "name": "ignored"},
    ])
    assert msgs == [ChatMessage("user", "x y"), ChatMessage("assistant", "")]


@pytest.mark.parametrize(
    "bad",
    [
        [],
        "hi",
        [{"role": "tool", "content": "x"}],
        [{"content": "x"}],
        [{"role": "user", "content": 3}],
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
        ["user"],
    ],
)
def test_bad_messages_are_chat_format_errors(bad: object) -> None:
    with pytest.raises(ChatFormatError):
        apply_chat_template(bad)
