"""Shape checks for the JSON of run directories, so a hand-edited or truncated file is one
`error:` + `hint:` line (exit 5) instead of a KeyError deep inside a renderer.

A shape is a type (or tuple of types), `None` for "may be null", or a dict of field → shape for
an object (missing optional fields are fine; present ones must match). Only the fields the
reports read are described; other fields pass through untouched.
"""

from __future__ import annotations

from typing import Any

from dsv4bisect.base.bounded import json_type
from dsv4bisect.errors import ConfigError

NUM = (int, float)
OPT_NUM = (int, float, type(None))
OPT_STR = (str, type(None))
OPT_DICT = (dict, type(None))
OPT_LIST = (list, type(None))

ARM = {"fingerprint": OPT_STR, "kind": OPT_STR, "patch_set": OPT_DICT, "faults": OPT_LIST,
       "inert": OPT_LIST, "launch_s": OPT_LIST, "crashes": OPT_LIST, "cached": OPT_DICT}
RUN = {"schema": str, "status": OPT_STR, "probe": OPT_DICT, "arms": OPT_DICT,
       "timing": OPT_DICT, "error": OPT_DICT, "overrides": OPT_DICT, "versions": OPT_DICT,
       "wall_s": OPT_NUM, "aa": OPT_DICT}
FAMILY = {"family": str, "n": int, "baseline_accuracy": OPT_NUM, "candidate_accuracy": OPT_NUM,
          "repeat_accuracy": OPT_NUM, "baseline_right": int, "b": int, "c": int, "p_value": NUM,
          "evidence": bool}
CELL = {"cell": str, "arm": str, "concurrency": int, "n": int, "b": int, "c": int,
        "p_value": NUM, "p_holm": NUM, "failed": bool}
VERDICT = {"schema": str, "verdict": str, "reasons": list, "probe": dict, "families": dict,
           "overall": dict, "cells": list, "signatures": dict, "drift": dict, "aa": dict,
           "power": dict, "evidence": dict, "conditions": dict, "throughput": dict}


def check(value: Any, shape: Any, shown: str, where: str = "") -> None:
    """Raise ConfigError naming the first field of `value` that does not match `shape`."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            _bad(shown, where, "an object", value)
        for key, sub in shape.items():
            if key in value:
                check(value[key], sub, shown, f"{where}.{key}" if where else key)
        return
    if isinstance(value, bool) and bool not in _types(shape):
        _bad(shown, where, _names(shape), value)  # True is an int in Python, not in our files
    if not isinstance(value, shape):
        _bad(shown, where, _names(shape), value)


def check_items(items: Any, shape: Any, shown: str, where: str) -> None:
    """Every value of a list or object matches `shape`."""
    values = items.values() if isinstance(items, dict) else items
    for index, item in enumerate(values):
        check(item, shape, shown, f"{where}[{index}]")


def _types(shape: Any) -> tuple[type, ...]:
    return shape if isinstance(shape, tuple) else (shape,)


def _names(shape: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", int: "an integer",
             float: "a number", bool: "a boolean", type(None): "null"}
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in _types(shape)))


def _bad(shown: str, where: str, expected: str, value: Any) -> None:
    got = json_type(value)
    field = f" `{where}`" if where else ""
    raise ConfigError(f"{shown}:{field} expected {expected}, got {got}",
                      "the file was edited or truncated; re-run the command that wrote it")
