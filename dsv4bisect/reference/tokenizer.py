"""The embedded engine's byte-level tokenizer.

Every UTF-8 byte is one token; special tokens sit below the byte range, DeepSeek style (bos 0,
eos 1). Any text round-trips exactly. Specials are produced only by the chat template
(`reference/chat.py`), never by encoding text: a user typing `<｜User｜>` gets its bytes.

Id layout (stable; the chat template, the probe and the training data rely on it):

| ids | tokens |
| --- | --- |
| 0 | `<｜begin▁of▁sentence｜>` (bos) |
| 1 | `<｜end▁of▁sentence｜>` (eos) |
| 2, 3 | `<｜User｜>`, `<｜Assistant｜>` |
| 4, 5 | `<think>`, `</think>` |
| 6 | `<｜▁pad▁｜>` |
| 7–15 | reserved specials |
| 16–271 | bytes 0x00–0xFF (id = 16 + byte) |
| 272 … vocab_size-1 | reserved (the model's vocabulary is larger than the tokenizer's) |

Reserved ids are never produced by `encode`; a model may still predict them, so they decode as
`<｜reserved_N｜>` (or to nothing with `skip_special_tokens`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dsv4bisect.errors import ConfigError

BOS_ID = 0
EOS_ID = 1
USER_ID = 2
ASSISTANT_ID = 3
THINK_START_ID = 4
THINK_END_ID = 5
PAD_ID = 6
BYTE_OFFSET = 16
N_TOKENS = BYTE_OFFSET + 256  # ids the tokenizer defines (specials + bytes)

SPECIAL_TOKENS: dict[int, str] = {
    BOS_ID: "<｜begin▁of▁sentence｜>",
    EOS_ID: "<｜end▁of▁sentence｜>",
    USER_ID: "<｜User｜>",
    ASSISTANT_ID: "<｜Assistant｜>",
    THINK_START_ID: "<think>",
    THINK_END_ID: "</think>",
    PAD_ID: "<｜▁pad▁｜>",
}


def is_byte_token(token_id: int) -> bool:
    return BYTE_OFFSET <= token_id < N_TOKENS


def special_name(token_id: int) -> str:
    """The printed form of a non-byte token (named special or reserved)."""
    return SPECIAL_TOKENS.get(token_id, f"<｜reserved_{token_id}｜>")


@dataclass(frozen=True)
class ByteTokenizer:
    """Byte-level tokenizer for a model with `vocab_size` logits (>= 272)."""

    vocab_size: int = 512

    def __post_init__(self) -> None:
        if self.vocab_size < N_TOKENS:
            raise ConfigError(
                f"vocab_size {self.vocab_size} is too small for the byte-level tokenizer",
                f"use a vocab_size of at least {N_TOKENS} (specials 0-15, bytes 16-271)",
            )

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Token ids of `text` (bytes only; `add_bos` prepends bos as DeepSeek's tokenizer does).

        Raises UnicodeEncodeError (a ValueError) for text that is not valid Unicode (lone
        surrogates).
        """
        ids = [b + BYTE_OFFSET for b in text.encode("utf-8")]
        return [BOS_ID, *ids] if add_bos else ids

    def check_ids(self, ids: Iterable[int]) -> None:
        """Raise ValueError naming the first id outside [0, vocab_size)."""
        for token_id in ids:
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(f"token id {token_id} is outside [0, {self.vocab_size})")

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of `ids`; partial UTF-8 sequences become U+FFFD instead of failing."""
        self.check_ids(ids)
        parts: list[str] = []
        run = bytearray()
        for token_id in ids:
            if is_byte_token(token_id):
                run.append(token_id - BYTE_OFFSET)
                continue
            if run:
                parts.append(run.decode("utf-8", errors="replace"))
                run.clear()
            if not skip_special_tokens:
                parts.append(special_name(token_id))
        if run:
            parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a special's printed form in UTF-8)."""
        self.check_ids((token_id,))
        if is_byte_token(token_id):
            return bytes((token_id - BYTE_OFFSET,))
        return special_name(token_id).encode("utf-8")

    def token_text(self, token_id: int) -> str:
        """One token decoded alone, as SGLang's logprob text (`batch_decode` of single ids)."""
        return self.decode((token_id,))

    def is_special(self, token_id: int) -> bool:
        return not is_byte_token(token_id)
