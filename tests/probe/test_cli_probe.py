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


# -- issue 41, item 2: a `run` directory is a baseline, with its A/A repeat ------------------------

def run_directory(path: Path) -> Path:
    """A `dsv4bisect run` directory as `probe` reads it: run.json of the run, the good end's
    probe run in baseline/ and its A/A repeat in baseline-repeat/."""
    saved_baseline(path)
    base = ProbeRun.load(path / "baseline")
    base.save(path / "baseline-repeat")
    (path / "run.json").write_text('{"schema": "dsv4bisect.run/1", "status": "done"}')
    return path


def test_a_run_directory_is_a_baseline_with_its_aa_repeat(tmp_path: Path) -> None:
    from dsv4bisect.probe.session import resolve_baseline

    run = run_directory(tmp_path / "run")
    for given in (run, run / "baseline"):  # the run, or its baseline folder: both keep the A/A
        source = resolve_baseline(str(given), None, None)
        assert source.run is not None and source.repeat is not None, given
        assert source.run.path == str(run / "baseline")
        assert source.repeat.path == str(run / "baseline-repeat")
    (tmp_path / "lone").mkdir()
    ProbeRun.load(run / "baseline").save(tmp_path / "lone" / "only")
    assert resolve_baseline(str(tmp_path / "lone" / "only"), None, None).repeat is None


def test_a_run_that_never_measured_its_baseline_is_refused_by_name(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "baseline").mkdir(parents=True)
    (run / "run.json").write_text('{"schema": "dsv4bisect.run/1", "status": "error"}')
    result = invoke("http://127.0.0.1:9", "--baseline", str(run))
    assert isinstance(result.exception, ConfigError)
    assert "no measured baseline" in result.exception.message
    assert "dsv4bisect report" in (result.exception.hint or "")


def test_the_upgrade_hints_probe_command_runs_as_printed(cli, tmp_path: Path) -> None:
    """The command inside `git bisect run` that `bisect --upgrade-from` prints: its options
    exist, it takes the run directory, and an engine that does not answer is a skip (125)."""
    import shlex

    from dsv4bisect.bisect.upgrade import code_bisect_hint

    hint = code_bisect_hint("dsv4-flash-tp8-latest", "0.5.21", "0.5.23")
    line = hint.split("`dsv4bisect probe ")[1].split("`")[0]
    argv = ["probe", *shlex.split(line)]
    assert argv[1:4] == ["URL", "--baseline", "RUN"] and "--exit-policy" in argv
    run = run_directory(tmp_path / "run")
    argv = [{"URL": "http://127.0.0.1:9", "RUN": str(run)}.get(a, a) for a in argv]
    down = cli(*argv, "--out", tmp_path / "o")
    assert down.returncode == 125 and "cannot connect" in down.stderr
    assert "--warn-as" in invoke("--help").stdout
