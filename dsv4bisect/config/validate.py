"""Validate layered profile data against the schema; errors point at `file:line:col:`."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from dsv4bisect.config.layering import Layered
from dsv4bisect.config.schema import Profile
from dsv4bisect.config.yamlsource import KeyPath
from dsv4bisect.redact import is_secret
from dsv4bisect.errors import ConfigError, did_you_mean

_HINT = "see `dsv4bisect profile schema` for every key and type"


MAX_LINES = 8  # errors shown per profile; the rest are counted


def validate(layered: Layered) -> Profile:
    _refuse_nul(layered)
    try:
        return Profile.model_validate(layered.data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        lines = [_describe(layered, err) for err in errors[:MAX_LINES]]
        if len(errors) > MAX_LINES:
            lines.append(f"... and {len(errors) - MAX_LINES} more errors")
        raise ConfigError("\n".join(lines), _hint_for(errors[0])) from None


def _refuse_nul(layered: Layered) -> None:
    """No key or string may hold NUL: every value ends up in an argv, env or file name, where the
    OS refuses it only at launch. (Depth is bounded by the loader, so the walk is too.)"""
    stack: list[tuple[KeyPath, Any]] = [((), layered.data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and "\0" in key:
                    raise error_at(layered, path, "a key holds a NUL character", "remove it")
                stack.append((path + (key,), item))
        elif isinstance(value, list):
            stack.extend((path + (i,), item) for i, item in enumerate(value))
        elif isinstance(value, str) and "\0" in value:
            raise error_at(layered, path, "NUL character in a value",
                           "no engine process can receive NUL in an argument or env value")


def error_at(layered: Layered, path: KeyPath, message: str, hint: str | None = None) -> ConfigError:
    """A ConfigError positioned at the key `path` (or the closest key that exists)."""
    where = layered.source_of(path)
    dotted = ".".join(str(p) for p in path)
    prefix = f"{where}: " if where else ""
    return ConfigError(f"{prefix}{dotted}: {message}", hint)


def _describe(layered: Layered, err: dict[str, Any]) -> str:
    loc = tuple(err["loc"])
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        guess = did_you_mean(str(loc[-1]), _fields_at(Profile, loc[:-1]))
        message = f"unknown key `{loc[-1]}`" + (f"; {guess}" if guess else "")
    elif err["type"] == "missing":
        message = f"missing required key `{loc[-1]}`"
    elif "input" in err and not isinstance(err["input"], (dict, list)):
        shown = "***" if any(is_secret(str(part)) for part in loc) else _clip(repr(err["input"]))
        message = f"{message} (got {shown})"
    message = message.removeprefix("Value error, ")
    where = layered.source_of(loc)
    dotted = _clip(".".join(str(p) for p in loc) or "<profile>")
    if err["type"] == "extra_forbidden" and isinstance(where, str) and where.startswith("--set "):
        return f"{where}: {message}"  # the flag names the key the message names
    return f"{where}: {dotted}: {message}" if where else f"{dotted}: {message}"


def _clip(text: str, width: int = 80) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _hint_for(err: dict[str, Any]) -> str:
    if err["type"] == "extra_forbidden":
        return "profiles are strict: remove the key or fix its spelling; " + _HINT
    return _HINT


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the model found at `loc` (dict keys are skipped over)."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
        elif typing.get_origin(current) in (dict, list):
            current = typing.get_args(current)[-1]
        else:
            return []
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    """Strip Optional/Union-with-None and Annotated to reach a model or container type."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            annotation = models[0] if models else args[0]
        else:
            return annotation
