"""Resolve whatever a command was given: a profile file, a built-in name or a run directory."""

from __future__ import annotations

from pathlib import Path

from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.config.layering import is_dir
from dsv4bisect.config.resolve import Overrides, resolve


def load_config(ref: str, overrides: Overrides = Overrides()) -> EngineConfig:
    path = Path(ref)
    if is_dir(path):
        from dsv4bisect.engines.rundir import load_run_config

        return load_run_config(path)
    return resolve(ref, overrides)
