"""`dsv4bisect probe` argument handling (no server needed): errors carry exit codes 5 / 125.

The lead's `dsv4bisect.cli.main` turns a Dsv4BisectError into `error:`/`hint:` and its exit code;
here the command runs in a small Typer app and the raised error is inspected directly.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner, Result

from dsv4bisect.cli.probe import register
from dsv4bisect.errors import ConfigError, ProbeError
from dsv4bisect.probe import formats
from dsv4bisect.probe.grid import Case, Cell
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.spec import tier_spec
from dsv4bisect.probe.vocab import PROBE_VOCAB


def cli() -> typer.Typer:
    app = typer.Typer(add_completion=False)

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    return app


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli(), ["probe", *args])


def saved_baseline(path: Path) -> Path:
    c = formats.needle_content(random.Random(1), PROBE_VOCAB, 0.5, distractors=1)
    case = Case("needle/L256/d0.5/t2/0", Cell("needle", 256, 0.5, 2), 0, 1, 256,
                ({"role": "user", "content": c.question},), 256, c.expected, c.values, 0.5, 9)
    ProbeRun(tier_spec("ci"), "http://x", {}, (case,), ()).save(path / "baseline")
    return path


def test_help_names_the_exit_codes() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    assert "git bisect run" in result.stdout and "125 CANNOT_TEST" in result.stdout


def test_baseline_must_be_a_url_or_a_run_dir(tmp_path: Path) -> None:
    result = invoke("http://127.0.0.1:9", "--baseline", str(tmp_path / "nothing"))
    assert isinstance(result.exception, ConfigError) and result.exception.exit_code == 5
    assert "neither a URL nor a probe run directory" in result.exception.message


def test_missing_api_key_variable_is_bad_input(monkeypatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    result = invoke("http://127.0.0.1:9", "--baseline", "http://127.0.0.1:9",
                    "--api-key-env", "NO_SUCH_KEY_VAR")
    assert isinstance(result.exception, ConfigError)
    assert "NO_SUCH_KEY_VAR" in result.exception.message


def test_saved_baseline_tier_and_families_must_match(tmp_path: Path) -> None:
    base = saved_baseline(tmp_path)
    result = invoke("http://127.0.0.1:9", "--baseline", str(base), "--tier", "smoke")
    assert isinstance(result.exception, ConfigError) and "tier `ci`" in result.exception.message
    result = invoke("http://127.0.0.1:9", "--baseline", str(base), "--families", "needle")
    assert isinstance(result.exception, ConfigError)


def test_unknown_family_and_tier_are_bad_input() -> None:
    result = invoke("http://127.0.0.1:9", "--baseline", "http://127.0.0.1:9", "--families", "nedle")
    assert isinstance(result.exception, ConfigError) and result.exception.exit_code == 5
    result = invoke("http://127.0.0.1:9", "--baseline", "http://127.0.0.1:9", "--tier", "huge")
    assert isinstance(result.exception, ConfigError)


def test_unreachable_server_cannot_test(tmp_path: Path) -> None:
    base = saved_baseline(tmp_path)
    result = invoke("http://127.0.0.1:9", "--baseline", str(base), "--out", str(tmp_path / "o"))
    assert isinstance(result.exception, ProbeError) and result.exception.exit_code == 125
    assert "cannot connect" in result.exception.message


def _cli_has_probe() -> bool:
    from dsv4bisect.cli import app

    return any(c.name == "probe" for c in app.registered_commands)


@pytest.mark.skipif(not _cli_has_probe(), reason="the lead has not wired `probe` into the CLI yet")
def test_real_cli_exit_codes(cli, tmp_path: Path) -> None:
    bad = cli("probe", "http://127.0.0.1:9", "--baseline", str(tmp_path / "nothing"))
    assert bad.returncode == 5 and bad.stderr.startswith("error: ") and "hint: " in bad.stderr
    down = cli("probe", "http://127.0.0.1:9", "--baseline", str(saved_baseline(tmp_path)),
               "--out", str(tmp_path / "o"))
    assert down.returncode == 125 and "cannot connect" in down.stderr
