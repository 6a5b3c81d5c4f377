"""Issue 31, item 1: every command the tool prints runs. A bisect's "Reproduce" line for the
good end was `dsv4bisect run reference-all --tier smoke --only ''`, which `run` refuses, and a
re-test's line said "seed block 2, which `run` has no option for". Now the good end is
`--only none` and a re-test's block is `--seed-block N`; the slow test runs such a line on the
embedded engine and checks that the run's own report prints the same line back."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4bisect.bisect.trials.engine_runner import EngineRunner
from dsv4bisect.cli.options import overrides
from dsv4bisect.config.resolve import resolve
from dsv4bisect.errors import ConfigError
from dsv4bisect.report.run_report import reproduce_command

ROOT = Path(__file__).parents[2]


def test_only_none_is_every_patch_off_and_an_empty_only_is_still_refused() -> None:
    assert overrides(None, None, "none", None).only == ()
    assert overrides(None, None, " None ", None).only == ()
    for bad in ("", ",,,", " , "):
        with pytest.raises(ConfigError, match="names no patch") as exc:
            overrides(None, None, bad, None)
        assert "--only none" in (exc.value.hint or "")
    off = resolve("reference-all", overrides(None, None, "none", None))
    assert off.patch_set == resolve("reference").patch_set  # the six off: the good end


def test_the_good_end_and_a_retest_print_commands_run_accepts() -> None:
    runner = EngineRunner("reference-all", {}, sets=("engine.precision=exact",), tier="smoke")
    line = runner.reproduce({}, 2)
    argv = shlex.split(line)
    assert argv[:3] == ["dsv4bisect", "run", "reference-all"]
    assert argv[argv.index("--only") + 1] == "none" and "''" not in line
    assert argv[argv.index("--seed-block") + 1] == "2" and "#" not in line
    assert "--seed-block" not in runner.reproduce({}, 0)
    # what the command's overrides resolve to is the trial's configuration
    i = argv.index("--only")
    cfg = resolve("reference-all", overrides(None, None, argv[i + 1], ["engine.precision=exact"]))
    assert cfg.fingerprint == runner.good_cfg.fingerprint


def test_a_run_reports_reproduce_line_names_only_none_and_its_seed_block() -> None:
    run = {"profile": "reference-all", "tier": "smoke", "probe": {"seed_block": 3},
           "overrides": {"sets": ["engine.precision=exact"], "only": []}}
    assert reproduce_command(run) == ("dsv4bisect run reference-all --tier smoke --set "
                                      "engine.precision=exact --only none --seed-block 3")
    run["probe"]["seed_block"] = 0
    assert "--seed-block" not in reproduce_command(run)


@pytest.mark.e2e
@pytest.mark.slow  # two engines and two smoke-tier probes: about 2-4 minutes on the 2-core CPU
@pytest.mark.timeout(900)
def test_a_printed_reproduce_line_runs_on_the_embedded_engine(tmp_path: Path) -> None:
    """The good end's line at seed block 2 of the smoke tier: both issues of the report (the
    empty --only and block 2's copy case that did not fit) in one command, run as printed."""
    runner = EngineRunner("reference-all", {}, sets=("engine.precision=exact",), tier="smoke")
    line = runner.reproduce({}, 2)
    argv = shlex.split(line)
    assert argv[0] == "dsv4bisect"
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "dsv4bisect", *argv[1:], "--out", str(out),
                        "--json"], capture_output=True, text=True, timeout=850, check=False,
                       env={**os.environ, "NO_COLOR": "1"}, cwd=ROOT)
    assert r.returncode in (0, 4), r.stderr[-3000:]  # the good end against itself
    verdict = json.loads(r.stdout)
    assert verdict["probe"]["seed_block"] == 2 and verdict["probe"]["tier"] == "smoke"
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    report = (run_dir / "report.md").read_text()
    printed = report[report.index("## Reproduce"):].split("```")[1].strip()
    assert printed == line


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from dsv4bisect.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


@pytest.mark.parametrize("mistake", [("patches", "list", "--only", "mma-decode")])
def test_the_command_a_hint_suggests_is_accepted(mistake: tuple[str, ...], capsys) -> None:
    """A hint's `e.g. dsv4bisect ...` runs: not a usage error (2) nor bad input (5). (doctor on
    an SGLang profile exits 1 here, where SGLang is not installed: a finding, not a refusal.)"""
    code, _, err = _cli(capsys, *mistake)
    assert code == 5
    suggested = err[err.index("e.g. dsv4bisect ") + len("e.g. "):].splitlines()[0]
    argv = shlex.split(suggested)
    assert argv[0] == "dsv4bisect"
    code, _, err = _cli(capsys, *argv[1:])
    assert code in (0, 1), err


def test_doctor_takes_the_overrides_on_the_profile_run_would_run(capsys) -> None:
    """Issue 41, item 8: `doctor --enable P` with no profile was bad input (it checked SGLang);
    it now checks what `run --enable P` would run, reference-all on the embedded engine."""
    code, out, err = _cli(capsys, "doctor", "--enable", "mma-decode", "--json")
    assert code == 0, err
    assert "SGLang" not in out and "checkpoint embedded" in out
