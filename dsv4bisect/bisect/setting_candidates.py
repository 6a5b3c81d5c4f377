"""Settings as bisect candidates, beside the patches (`bisect --good-config A --bad-config B`).

A bisect names a configuration by {candidate: value}; a patch's value is its variant. A setting
is named by where it lives in the profile, so the trial's configuration is "the good end's
profile with these settings at the bad end's value":

- `engine.<key>` — a profile key (`engine.chunked_prefill_size`, `engine.moe_backend`,
  `engine.reference.max_model_len`, `engine.pd.decode.env.X`); the value is its JSON text.
- `env:<NAME>` — a variable of `engine.env`; the value is the string.
- `arg:<--flag>` — one server flag inside `engine.args`; the value is its value text ("" for a
  bare flag).

`ABSENT` is a value too: the setting is not stated at that end (the engine's default applies),
so switching it removes the key or the flag.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from dsv4bisect.config.resolve import Overrides

ABSENT = "(absent)"
ENV, ARG, KEY = "env:", "arg:", "engine."


def is_setting(name: str) -> bool:
    return name.startswith((ENV, ARG, KEY))


def setting_kind(name: str) -> str:
    """How a setting reaches the engine: `env` (a variable), `arg` (a server flag), or the
    profile key's own delivery (`key`: the launcher turns it into flags or settings)."""
    return "env" if name.startswith(ENV) else "arg" if name.startswith(ARG) else "key"


def setting_overrides(settings: Mapping[str, str]) -> Overrides:
    """The --set items, removals and flag edits that put `settings` in place."""
    sets: list[str] = []
    unset: list[str] = []
    args: list[tuple[str, str | None]] = []
    for name, value in settings.items():
        if name.startswith(ARG):
            args.append((name[len(ARG):], None if value == ABSENT else value))
            continue
        key = f"engine.env.{name[len(ENV):]}" if name.startswith(ENV) else name
        if value == ABSENT:
            unset.append(key)
        else:
            sets.append(f"{key}={json.dumps(value) if name.startswith(ENV) else value}")
    return Overrides(sets=tuple(sets), unset=tuple(unset), args=tuple(args))


def key_value(value: object) -> str:
    """A profile value as a setting's value: its JSON text (YAML reads it back unchanged)."""
    return json.dumps(value, sort_keys=True)
