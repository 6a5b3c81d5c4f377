"""Issue 41, item 3: a `--good-config/--bad-config` bisect's Reproduce lines measure exactly the
trial's two configurations.

The pasted step line used to set `--set engine.*` for both ends of `run`, so its baseline was
another configuration (fingerprint 9da4438053b661b4 against the bisect's 50681439bcb47522): a
setting culprit would have been compared with itself. The line now names the good end with
`run --good-config` and says a removed key or an edited flag as the section it leaves; it is
parsed here by `run`'s own command line and resolved as `run` resolves it, and once (slow) run.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
from typer.main import get_command

from dsv4bisect.bisect.config_question import config_question
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.engine_runner import EngineRunner
from dsv4bisect.cli import build_app
from dsv4bisect.cli.options import overrides
from dsv4bisect.run.ends import resolve_ends

RESULTS = Path(__file__).resolve().parents[2] / "docs/results/2026-12-02-cpu-diffbisect"
# subsets that hold each kind of difference: a patch variant, an env variable, a server flag,
# a profile key, and the ends themselves
SUBSETS = ((), ("mma-decode",), ("env:OMP_NUM_THREADS", "arg:--header-timeout"),
           ("engine.max_running_requests", "engine.disable_radix_cache"), None)


@pytest.fixture
def pair(tmp_path: Path) -> tuple[str, str]:
    for name in ("embedded-good.yaml", "embedded-bad.yaml"):
        shutil.copy(RESULTS / name, tmp_path / name)
    return str(tmp_path / "embedded-good.yaml"), str(tmp_path / "embedded-bad.yaml")


def runner_of(good: str, bad: str, tier: str | None = None) -> tuple[EngineRunner, BisectSpec]:
    """The bisect's own runner for `--good-config good --bad-config bad` (nothing launched)."""
    q = config_question(good, bad)
    runner = EngineRunner(q.profile, q.good, sets=q.sets, tier=tier, good_config=good)
    return runner, BisectSpec(candidates=q.candidates, good=q.good, bad=q.bad)


def as_run_parses(line: str) -> tuple[str, str, str]:
    """The pasted line through `run`'s command line, resolved as `run` resolves it: (its good
    end's fingerprint, its candidate's, the line's tier)."""
    argv = shlex.split(line.split("  #", 1)[0])
    assert argv[:2] == ["dsv4bisect", "run"], argv
    run = get_command(build_app(["run"])).commands["run"]  # type: ignore[attr-defined]
    params = run.make_context("run", argv[2:]).params
    ov = overrides(params["enable"], params["disable"], params["only"], params["sets"])
    ends = resolve_ends(params["profile"], ov, params["good_config"])
    return ends.good.fingerprint, ends.candidate.fingerprint, params["tier"]


@pytest.mark.parametrize("forward", [True, False], ids=["A-to-B", "B-to-A"])
def test_every_trial_line_resolves_to_the_trials_two_configurations(
        pair: tuple[str, str], forward: bool) -> None:
    good, bad = pair if forward else pair[::-1]
    runner, spec = runner_of(good, bad)
    for subset in SUBSETS:
        chosen = frozenset(spec.candidates if subset is None else subset)
        patches = spec.patches_for(chosen)
        line = runner.reproduce(patches, seed_block=1)
        assert "#" not in line, line  # exact: no note
        assert "--good-config" in line and "--seed-block 1" in line
        good_fp, cand_fp, tier = as_run_parses(line)
        assert good_fp == runner.good_cfg.fingerprint, (subset, line)
        assert cand_fp == runner.fingerprint(patches), (subset, line)
        assert tier == runner.spec.tier


def test_a_line_run_cannot_take_says_so() -> None:
    """One profile's bisect with a --good end that is not `run`'s own: the line says which good
    end the trial had instead of passing for it."""
    runner = EngineRunner("reference-all", {"mhc-bf16": "bf16"})
    line = runner.reproduce({"mhc-bf16": "bf16", "mma-decode": "split-k"})
    assert "# judged against the bisect's good end" in line
    assert runner.good_cfg.fingerprint in line


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(1200)
def test_a_pasted_line_measures_the_trials_fingerprints(cli, pair: tuple[str, str],
                                                       tmp_path: Path) -> None:
    """The Done-when row: a trial's line, pasted, runs the trial's own two configurations (the
    run's run.json arms against the bisect runner's fingerprints)."""
    runner, spec = runner_of(*pair, tier="ci")
    patches = spec.patches_for(frozenset({"engine.max_running_requests", "mma-decode"}))
    line = runner.reproduce(patches)
    argv = shlex.split(line)
    r = cli(*argv[1:], "--json", "--out", tmp_path / "runs", "--skip-preflight", cwd=tmp_path,
            timeout=1100)
    assert r.returncode in (0, 1, 4), r.stderr[-3000:]
    (run_json,) = (tmp_path / "runs").glob("*/run.json")
    arms = json.loads(run_json.read_text())["arms"]
    assert arms["baseline"]["fingerprint"] == runner.good_cfg.fingerprint
    assert arms["candidate"]["fingerprint"] == runner.fingerprint(patches)
