"""Issue 41, item 1: `git bisect run` must not blame a commit that cannot be tested.

git counts every exit code from 1 to 127 but 125 as "bad". `run` exits 5 on a profile that does
not validate, so in a history where one commit has a typo before the real fault, `git bisect
run dsv4bisect run PROFILE` landed on the typo. `--exit-policy git-bisect` makes every exit
that measured nothing 125 (git skips the commit); a verdict keeps its code, and the default
policy keeps 5 for every other caller.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4bisect.cli.exit_policy import ExitPolicy, exit_code, requested
from dsv4bisect.errors import EXIT_POLICIES, ExitCode


def test_git_bisect_policy_keeps_verdicts_and_skips_what_measured_nothing() -> None:
    assert [p.value for p in ExitPolicy] == list(EXIT_POLICIES)
    kept = {0: 0, 1: 1, 4: 4, 125: 125, 130: 130}  # verdicts, cannot-test, interrupted
    skipped = {2: 125, 5: 125, 70: 125, 3: 125}  # usage, bad input, internal: nothing measured
    for code, final in {**kept, **skipped}.items():
        assert exit_code(ExitPolicy.git_bisect, code) == final, code
        assert exit_code(ExitPolicy.default, code) == code


def test_the_policy_is_read_from_the_command_line_of_run_and_probe_only() -> None:
    assert requested(["run", "p.yaml", "--exit-policy", "git-bisect"]) is ExitPolicy.git_bisect
    assert requested(["probe", "URL", "--exit-policy=git-bisect"]) is ExitPolicy.git_bisect
    assert requested(["run", "--exit-policy", "default"]) is ExitPolicy.default
    assert requested(["bisect", "--exit-policy", "git-bisect"]) is ExitPolicy.default
    assert requested(["run", "--", "--exit-policy", "git-bisect"]) is ExitPolicy.default
    assert requested([]) is ExitPolicy.default


def _typo_profile(tmp_path: Path) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text("schema_version: 1\nname: deploy\nextends: reference\n"
                    "patches:\n  hash-topk-scalin: true\n")
    return path


def test_an_invalid_profile_is_bad_input_by_default_and_a_skip_for_git_bisect(
        cli, tmp_path: Path) -> None:
    profile = _typo_profile(tmp_path)
    plain = cli("run", profile, "--out", tmp_path / "runs")
    assert plain.returncode == ExitCode.BAD_INPUT, plain.stderr
    assert "hash-topk-scalin" in plain.stderr and "hint:" in plain.stderr
    skip = cli("run", profile, "--out", tmp_path / "runs", "--exit-policy", "git-bisect")
    assert skip.returncode == 125, skip.stderr
    assert "hash-topk-scalin" in skip.stderr  # the error is still said
    assert "exit 125 instead of 5 (--exit-policy git-bisect)" in skip.stderr
    missing = cli("run", tmp_path / "gone.yaml", "--exit-policy", "git-bisect")
    assert missing.returncode == 125 and "error:" in missing.stderr
    assert cli("run", profile, "--no-such-flag").returncode == ExitCode.USAGE
    usage = cli("run", profile, "--no-such-flag", "--exit-policy", "git-bisect")
    assert usage.returncode == 125 and "No such option" in usage.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_probe_takes_the_same_policy(cli, tmp_path: Path) -> None:
    gone = tmp_path / "nothing"
    assert cli("probe", "http://127.0.0.1:9", "--baseline", gone).returncode == 5
    skip = cli("probe", "http://127.0.0.1:9", "--baseline", gone, "--exit-policy", "git-bisect")
    assert skip.returncode == 125 and "neither a URL nor" in skip.stderr


# -- a real `git bisect run` over a history with an untestable commit before the fault ---------

PROFILE = """schema_version: 1
name: deploy
extends: reference
description: {what}
probe:
  # the ci tier at four depths: enough paired answers (16) for the fault's lost facts to be a
  # FAIL, about a minute a run on this CPU
  tier: ci
  depths: [0.2, 0.4, 0.6, 0.8]
patches:
{patches}
"""
FAULT = "  hash-topk-scaling: true\n  fp8-wo-a-gemm: {variant: scale-layout}"
# (commit message, patches block). With the good end first and the last commit bad, git tests
# the typo commit first (the midpoint of this history), then its neighbours.
HISTORY = (("every patch off", "  mma-decode: false"),
           ("an unrelated edit", "  mma-decode: false\n  mhc-bf16: false"),
           ("typo in a patch name", "  hash-topk-scalin: true"),
           ("fix the typo", "  hash-topk-scaling: true"),
           ("the fault lands", FAULT),
           ("a later edit", FAULT + "\n  mhc-bf16: false"))


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True,
                          check=False)


def _bisect(repo: Path, commits: list[str], script: Path) -> tuple[str, str]:
    """`git bisect run SCRIPT` from the first commit (good) to the last (bad): (the first bad
    commit's message, what was tested in order: good/bad/skip per commit message)."""
    assert _git(repo, "bisect", "start", commits[-1], commits[0]).returncode == 0
    result = _git(repo, "bisect", "run", str(script))
    log = _git(repo, "bisect", "log").stdout
    _git(repo, "bisect", "reset")
    assert result.returncode == 0, result.stdout + result.stderr
    first = result.stdout.split(" is the first bad commit")[0].split()[-1]
    names = {c: message for c, (message, _) in zip(commits, HISTORY)}
    tested = [f"{line.split()[1].rstrip(':')} {names[line.split('[')[1][:40]]}"
              for line in log.splitlines() if line.startswith("# ") and "[" in line
              and line.split("[")[1][:40] in names and "status" not in line]
    return names[_git(repo, "rev-parse", first).stdout.strip()], "; ".join(tested)


@pytest.mark.slow  # three measured runs of about a minute each, the first with the baseline
@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_bisect_run_skips_the_invalid_commit_and_lands_on_the_fault(tmp_path: Path) -> None:
    repo = tmp_path / "deploy"
    repo.mkdir()
    assert _git(repo, "init", "-q").returncode == 0
    commits = []
    for message, patches in HISTORY:
        (repo / "deploy.yaml").write_text(PROFILE.format(what=message, patches=patches))
        _git(repo, "add", "deploy.yaml")
        assert _git(repo, "commit", "-q", "-m", message).returncode == 0
        commits.append(_git(repo, "rev-parse", "HEAD").stdout.strip())
    runs = tmp_path / "runs"  # outside the history: git's checkouts never see run directories

    def script(*extra: str) -> Path:
        path = tmp_path / f"test{len(extra)}.sh"
        path.write_text(f"#!/bin/sh\nexec {sys.executable} -m dsv4bisect run deploy.yaml "
                        f"--out {runs} {' '.join(extra)}\n")
        path.chmod(0o755)
        return path

    # As the issue found it: exit 5 counts as bad, and git blames the typo.
    blamed, tested = _bisect(repo, commits, script())
    assert blamed == "typo in a patch name", tested
    # With the policy the typo commit is skipped and git lands on the fault.
    blamed, tested = _bisect(repo, commits, script("--exit-policy", "git-bisect"))
    assert blamed == "the fault lands", tested
    assert "skip typo in a patch name" in tested, tested
