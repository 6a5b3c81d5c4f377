"""The DeepSeek-V4 chat template (chat mode, thinking off) over the byte-level tokenizer.

Layout, the same as DeepSeek-V4's own encoder in chat mode (SGLang `encoding_dsv4.py`):

    <bos> {system} <｜User｜>{user} <｜Assistant｜></think>{answer}<eos> <｜User｜>{user} ...

- bos once, at the start; system text follows it (or any earlier turn) with no marker.
- A user turn is `<｜User｜>` + its text. When the next message is an assistant turn, or the user
  turn is the last message and `add_generation_prompt` is set, `<｜Assistant｜></think>` follows
  (`</think>`: thinking is off, so the answer starts right away).
- An assistant turn is its text + eos (no eos when `continue_final` is set on the last message,
  so the model continues it).
Spaces above are for reading only; nothing is inserted between parts. Message text is encoded as
bytes, so specials come only from this template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dsv4bisect.reference.tokenizer import (
    ASSISTANT_ID,
    BOS_ID,
    EOS_ID,
    THINK_END_ID,
    USER_ID,
    ByteTokenizer,
    special_name,
)

ROLES = ("system", "user", "assistant")
_TOKENIZER = ByteTokenizer()


class ChatFormatError(ValueError):
    """Messages the template cannot render (an HTTP 400 for the server)."""


@dataclass(frozen=True)
class ChatMessage:
    role: str  # system | user | assistant
    content: str


def normalize_messages(messages: object) -> list[ChatMessage]:
    """Check OpenAI-style messages and flatten their content to text.

    Roles are matched case-insensitively (as SGLang does); content may be a string, null, or a
    list of `{"type": "text", "text": ...}` parts, joined with a space (SGLang's string format).
    """
    if not isinstance(messages, list) or not messages:
        raise ChatFormatError("`messages` must be a non-empty list")
    out = []
    for i, raw in enumerate(messages):
        if not isinstance(raw, Mapping):
            raise ChatFormatError(f"messages[{i}] must be an object")
        role = raw.get("role")
        if not isinstance(role, str) or role.lower() not in ROLES:
            raise ChatFormatError(
                f"messages[{i}].role {role!r} is not supported by the embedded engine's chat "
                f"template (roles: {', '.join(ROLES)})"
            )
        out.append(ChatMessage(role.lower(), _content_text(raw.get("content"), i)))
    return out


def _content_text(content: object, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise ChatFormatError(
                    f"messages[{index}].content: only text parts are supported "
                    '(`{"type": "text", "text": ...}`)'
                )
            texts.append(part["text"])
        return " ".join(texts)
    raise ChatFormatError(f"messages[{index}].content must be a string, a list of parts or null")


def _segments(
    messages: Sequence[ChatMessage], add_generation_prompt: bool, continue_final: bool
) -> list[int | str]:
    """The rendered conversation as special-token ids and text pieces, in order."""
    out: list[int | str] = [BOS_ID]
    last = len(messages) - 1
    for i, msg in enumerate(messages):
        if msg.role == "system":
            out.append(msg.content)
        elif msg.role == "user":
            out += [USER_ID, msg.content]
            following = messages[i + 1].role if i < last else None
            if following == "assistant" or (following is None and add_generation_prompt):
                out += [ASSISTANT_ID, THINK_END_ID]
        else:
            out.append(msg.content)
            if not (continue_final and i == last):
                out.append(EOS_ID)
    return out


def _as_messages(messages: Sequence[ChatMessage] | object) -> list[ChatMessage]:
    if isinstance(messages, list) and messages and all(
        isinstance(m, ChatMessage) for m in messages
    ):
        return messages
    return normalize_messages(messages)


def apply_chat_template(
    messages: Sequence[ChatMessage] | object,
    add_generation_prompt: bool = True,
    *,
    continue_final: bool = False,
) -> list[int]:
    """Token ids of a conversation (ChatMessage list or OpenAI-style dicts)."""
    ids: list[int] = []
    for seg in _segments(_as_messages(messages), add_generation_prompt, continue_final):
        ids += _TOKENIZER.encode(seg) if isinstance(seg, str) else [seg]
    return ids


def render_chat_text(
    messages: Sequence[ChatMessage] | object,
    add_generation_prompt: bool = True,
    *,
    continue_final: bool = False,
) -> str:
    """The same conversation as text with specials spelled out (for debugging and docs)."""
    segs = _segments(_as_messages(messages), add_generation_prompt, continue_final)
    return "".join(s if isinstance(s, str) else special_name(s) for s in segs)
