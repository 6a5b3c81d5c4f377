"""Every exit-5 path prints a `hint:` line, and a profile name cannot outgrow a file name
(issue 30, item 13): a name of ~230 characters validated, then `run` crashed with "File name
too long"; `extends: [..]` and other fuzzer inputs exited 5 without a hint."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_inproc import cli

from dsv4bisect.errors import BisectError, ConfigError, EngineError


def test_a_long_profile_name_is_refused_at_validation(tmp_path: Path) -> None:
    path = tmp_path / "long.yaml"
    path.write_text(f"schema_version: 1\nname: {'a' * 240}\nextends: reference\n")
    for args in (("profile", "validate", str(path)), ("profile", "show", str(path)),
                 ("run", str(path), "--out", str(tmp_path / "runs"))):
        result = cli(*args)
        result.assert_error()
        assert "at most 64 characters" in result.err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("extends", ["[a, b]", "{x: 1}", "7", "true"])
def test_a_non_string_extends_has_a_hint(tmp_path: Path, extends: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(f"schema_version: 1\nname: p\nextends: {extends}\n")
    for args in (("profile", "validate", str(path)), ("profile", "show", str(path), "--resolved")):
        cli(*args).assert_error()  # exit 5 with `error:` and `hint:` lines


def test_a_bad_input_error_without_a_hint_gets_the_generic_one() -> None:
    assert ConfigError("x").hint and BisectError("x", None).hint
    assert EngineError("x").hint is None  # exit 125 carries its own reason, no fallback
