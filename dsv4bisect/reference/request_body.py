"""Typed reading of JSON request bodies, with SGLang-style 400 messages.

SGLang's request models ignore fields they do not know, so the server does too; but a field it
knows and the embedded engine cannot honour (min_p, penalties, streaming, tools, n > 1 ...) is a 400
rather than a silent no-op, so a probe never measures something other than what it asked for.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any, overload


class ApiError(Exception):
    """A request the server refuses; becomes a JSON error body with `status`."""

    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type


# Bounds on a body's JSON, so that no shape of input reaches code that would fail on it: every
# request the API knows is a handful of levels deep (messages -> content parts -> text: 4).
MAX_JSON_DEPTH = 64


def parse_json(raw: bytes) -> object:
    """A request body as JSON, or ApiError(400) for anything that is not plain, sane JSON.

    Refused: bytes that are not UTF-8 (RFC 8259 for network JSON), nesting deeper than
    MAX_JSON_DEPTH (the parser itself raises RecursionError near 1000 levels; shallower but deep
    values would still break `show` and the reply's encoder), integers over Python's int-str
    limit (4300 digits: a ValueError), NaN/Infinity (not JSON), and lone surrogates (`"\\ud800"`
    is valid JSON text but no Unicode string: it cannot be tokenized, nor sent back as UTF-8).
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(f"malformed JSON body: not UTF-8 ({exc.reason} at byte {exc.start})"
                       ) from None
    if not text.strip():
        raise ApiError("the request needs a JSON body")
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ApiError(f"malformed JSON body: nested deeper than {MAX_JSON_DEPTH} levels"
                       ) from None
    except json.JSONDecodeError as exc:
        raise ApiError(f"malformed JSON body: {exc}") from None
    except ValueError:  # Python's int-str limit: "Exceeds the limit (4300 digits) ..."
        limit = getattr(sys, "get_int_max_str_digits", lambda: 4300)()  # 3.10.7+
        raise ApiError(f"malformed JSON body: an integer has more than {limit} digits"
                       ) from None
    _check_tree(data)
    return data


def _no_constant(name: str) -> object:
    raise ApiError(f"malformed JSON body: {name} is not a JSON value")


def _check_tree(data: object) -> None:
    """Depth and string checks without recursion (the value may be as deep as the parser let
    it be)."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
        elif isinstance(value, list | dict):
            if depth > MAX_JSON_DEPTH:
                raise ApiError(f"malformed JSON body: nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(value, dict):
                for key in value:
                    _check_text(key)
                stack.extend((v, depth + 1) for v in value.values())
            else:
                stack.extend((v, depth + 1) for v in value)


def _check_text(text: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError("the body has a string that is not valid Unicode (a lone surrogate, "
                       f"{show_surrogate(text)})") from None


def show_surrogate(text: str) -> str:
    bad = next(c for c in text if "\ud800" <= c <= "\udfff")
    return f"U+{ord(bad):04X}"


def show(value: object) -> str:
    """A request value as the client wrote it (JSON), shortened."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."




def _same(value: object, allowed: object) -> bool:
    """Equality that keeps bools apart from numbers (JSON `true` is not `1`)."""
    if isinstance(value, bool) or isinstance(allowed, bool) or value is None or allowed is None:
        return value is allowed
    return bool(value == allowed)


class Body:
    """A JSON object with typed getters; every mistake raises ApiError(400)."""

    def __init__(self, data: object, where: str = "request") -> None:
        if not isinstance(data, dict):
            raise ApiError(f"{where} must be a JSON object")
        self.data: dict[str, Any] = data
        self.where = where

    def __contains__(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    @overload
    def get_int(self, key: str, default: int, *, minimum: int | None = None) -> int: ...

    @overload
    def get_int(self, key: str, default: None, *, minimum: int | None = None) -> int | None: ...

    def get_int(self, key: str, default: int | None, *, minimum: int | None = None) -> int | None:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(f"`{key}` must be an integer, got {show(value)}")
        if minimum is not None and value < minimum:
            raise ApiError(f"`{key}` must be >= {minimum}, got {value}")
        return value

    def get_bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ApiError(f"`{key}` must be a boolean, got {show(value)}")
        return value

    def get_str(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise ApiError(f"`{key}` must be a string, got {show(value)}")
        return value

    def get_strs(self, key: str) -> tuple[str, ...]:
        """A string or a list of strings (OpenAI's `stop`)."""
        value = self.data.get(key)
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ApiError(f"`{key}` must be a string or a list of strings")

    def get_ints(self, key: str) -> tuple[int, ...] | None:
        value = self.data.get(key)
        if value is None:
            return None
        if not is_int_list(value):
            raise ApiError(f"`{key}` must be a list of integers")
        return tuple(value)

    def require(self, key: str, allowed: Iterable[object], why: str | None = None) -> None:
        """Refuse a known field whose value the embedded engine cannot honour."""
        value = self.data.get(key)
        allowed = tuple(allowed)
        if value is None or any(_same(value, a) for a in allowed):
            return
        shown = ", ".join(show(a) for a in allowed if a is not None)
        raise ApiError(why or f"`{key}`={show(value)} is not supported by the embedded engine "
                              f"(supported: {shown or 'unset'})")

    def get_number(self, key: str, default: float, low: float, high: float) -> float:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ApiError(f"`{key}` must be a number, got {show(value)}")
        if not low <= value <= high:
            raise ApiError(f"`{key}` must be in [{low}, {high}], got {value}")
        return float(value)

    def sampling(self, seed_key: str) -> dict[str, Any]:
        """SGLang's sampling parameters (`temperature`, `top_p`, `top_k`, the seed under
        `seed_key`) as GenSpec fields. Unset temperature is greedy here (SGLang's default is
        1.0; the embedded engine keeps greedy, its behaviour before it sampled)."""
        top_p = self.get_number("top_p", 1.0, 0.0, 1.0)
        if top_p == 0:
            raise ApiError("`top_p` must be in (0, 1], got 0")
        top_k = self.get_int("top_k", -1, minimum=-1)
        return {"temperature": self.get_number("temperature", 0.0, 0.0, 100.0),
                "top_p": top_p, "top_k": -1 if top_k == 0 else top_k,
                "seed": self.get_int(seed_key, None)}

    def unknown(self, known: Iterable[str]) -> list[str]:
        return sorted(set(self.data) - set(known))


def is_int_list(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )


# Known OpenAI/SGLang sampling fields the engine does not implement, and the only values it
# honours (temperature, top_p, top_k and the seed it implements: `Body.sampling`). Leaving a
# field unset (or null) is always fine.
SAMPLING_DEFAULTS: dict[str, tuple[object, ...]] = {
    "min_p": (0,),
    "n": (1,),
    "best_of": (1,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "repetition_penalty": (1,),
    "min_tokens": (0,),
    "min_new_tokens": (0,),
    "stream": (False,),
    "logit_bias": ({},),
    "regex": (),
    "ebnf": (),
    "json_schema": (),
    "structural_tag": (),
    "stop_regex": (),
    "custom_logit_processor": (),
    "tools": ([],),
    "response_format": ({"type": "text"},),
    "suffix": ("",),
    "lora_path": (),
}


def check_sampling(body: Body, keys: Iterable[str]) -> None:
    """No sampling feature the engine would silently ignore."""
    for key in keys:
        body.require(key, SAMPLING_DEFAULTS[key])
