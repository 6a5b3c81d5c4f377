"""Does an argv parse as `vllm serve` of a given release? Checked against the release's own
option definitions (the shipped facts, `facts.py`), the way vLLM's `FlexibleArgumentParser`
reads it (`vllm/utils/argparse_utils.py`):

- the option name's underscores become dashes up to the first `.` (`--max_num_seqs`);
- `-O3` is `--optimization-level 3`;
- `--json-option.key=value` / `--json-option.key value` (dotted keys, nested) are merged into
  one JSON object per option, values parsed as JSON where they are JSON;
- a boolean field's option is `--x` / `--no-x` (BooleanOptionalAction) and takes no value; a
  `bool | str` field's takes an optional one; a list field's one or more;
- an option taking a config dataclass takes a JSON object whose keys must be that class's
  fields (vLLM validates it with pydantic: an unknown key is an error, a renamed one too, e.g.
  `use_fp4_indexer_cache` on 0.34.0, where it became `indexer_kv_dtype`).

Pure: no vLLM import, no torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from dsv4bisect.base.vllm_releases import fits
from dsv4bisect.errors import did_you_mean

HUMAN_INT = re.compile(r"^\d+(\.\d+)?[kKmMgGtT]?$")


def _name(token: str) -> str:
    """vLLM's preprocessing of an option name: `_` -> `-` from `--` to the first `.`."""
    head, dot, rest = token[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return text


def _set_path(target: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        nxt = target.get(key)
        if not isinstance(nxt, dict):
            nxt = target[key] = {}
        target = nxt
    target[keys[-1]] = value


def _check_value(flag: str, row: dict[str, Any], text: str, facts: dict[str, Any]) -> str | None:
    kind = row.get("value")
    if kind == "int":
        if text.lstrip("-").isdigit() or HUMAN_INT.match(text) or text == "auto" \
                or text.lower() == "none":
            return None
        return f"{flag} takes an integer, got {text!r}"
    if kind == "float":
        try:
            float(text)
        except ValueError:
            return f"{flag} takes a number, got {text!r}"
        return None
    if kind == "choice":
        choices = row.get("choices") or []
        norm = text.lower().replace("-", "_")
        if text in map(str, choices) or norm in map(str, choices) or (
                row.get("none") and text.lower() == "none"):
            return None
        return f"{flag}: {text!r} is not one of {', '.join(map(str, choices))}"
    if kind == "json":
        return _check_json(flag, row, _value(text), facts)
    return None


def _check_json(flag: str, row: dict[str, Any], value: Any, facts: dict[str, Any]) -> str | None:
    name = row.get("config")
    if not isinstance(value, dict):
        return f"{flag} takes a JSON object ({name}), got {json.dumps(value)[:60]}"
    why = fits({"kinds": ["config"], "config": name}, value, facts.get("configs"))
    return None if why is None else f"{flag}: {why}"


def serve_args(argv: Sequence[str]) -> list[str]:
    """The arguments after `serve` (the whole argv when it has no `serve`)."""
    argv = list(argv)
    return argv[argv.index("serve") + 1:] if "serve" in argv else argv


def _optimization_level(tokens: list[str]) -> list[str]:
    """`-O3` / `-O=3` / `-O 3` -> `--optimization-level 3`, as vLLM's parser rewrites them."""
    out: list[str] = []
    for i, tok in enumerate(tokens):
        if tok.startswith("-O") and tok != "-O":
            out += ["--optimization-level", tok[3:] if tok[2:3] == "=" else tok[2:]]
        elif tok == "-O" and i + 1 < len(tokens) and tokens[i + 1] in ("0", "1", "2", "3"):
            out.append("--optimization-level")
        else:
            out.append(tok)
    return out


def check_argv(argv: Sequence[str], facts: dict[str, Any]) -> list[str]:
    """Every problem `vllm serve` of the facts' release would have with `argv` (after `serve`
    when present); [] when it parses."""
    options: dict[str, dict[str, Any]] = facts["cli"]
    by_flag = {f: (long, row) for long, row in options.items() for f in (long, *row["aliases"])}
    tokens = _optimization_level(serve_args(argv))
    problems: list[str] = []
    dotted: dict[str, dict[str, Any]] = {}
    positional = 0
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("-") or tok == "-":
            positional += 1
            if positional > 1:
                problems.append(f"unexpected argument {tok!r} (vllm serve takes one model)")
            continue
        raw, eq, inline = tok.partition("=")
        name = _name(raw) if raw.startswith("--") else raw
        if "." in name:  # --json-option.key[.key] value
            head, _, path = name.partition(".")
            if not eq:
                if i >= len(tokens):
                    problems.append(f"{name} needs a value")
                    break
                inline, i = tokens[i], i + 1
            dotted.setdefault(head, {})
            _set_path(dotted[head], path.rstrip("+").split("."), _value(inline))
            continue
        negated = name.startswith("--no-") and name not in by_flag
        key = "--" + name[5:] if negated else name
        if key not in by_flag:
            hint = did_you_mean(key, list(options))
            problems.append(f"unknown option {name}" + (f" ({hint})" if hint else ""))
            continue
        long, row = by_flag[key]
        kind = row.get("value")
        if negated and kind != "bool":
            problems.append(f"{name}: {long} is not a boolean option")
            continue
        if kind in ("bool", "flag"):
            if eq:
                problems.append(f"{name} takes no value")
            continue
        if kind == "bool-or-str":
            if not eq and i < len(tokens) and not tokens[i].startswith("-"):
                i += 1
            continue
        if kind == "list":
            values = [inline] if eq else []
            while not eq and i < len(tokens) and not tokens[i].startswith("-"):
                values.append(tokens[i])
                i += 1
            if not values:
                problems.append(f"{name} needs at least one value")
            continue
        if not eq:
            if i >= len(tokens):
                problems.append(f"{name} needs a value")
                break
            inline, i = tokens[i], i + 1
        why = _check_value(long, row, inline, facts)
        if why:
            problems.append(why)
    for head, value in dotted.items():
        if head not in by_flag:
            problems.append(f"unknown option {head} (given as {head}.<key>)")
            continue
        long, row = by_flag[head]
        if row.get("value") != "json":
            problems.append(f"{head} takes no JSON keys ({head}.<key> given)")
            continue
        why = _check_json(long, row, value, facts)
        if why:
            problems.append(why)
    return problems
