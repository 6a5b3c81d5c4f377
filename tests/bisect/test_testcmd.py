"""The `--test-cmd` runner: exit codes like `git bisect run`, the patch set in the environment."""

from __future__ import annotations

import sys
import textwrap

import pytest

from dsv4bisect.bisect.trials.runner import Runner
from dsv4bisect.bisect.trials.testcmd import TestCommandRunner
from dsv4bisect.errors import BisectError
from dsv4bisect.probe import verdict as V


def script(tmp_path, body: str) -> list[str]:
    path = tmp_path / "check.py"
    path.write_text("import os, sys, time\n" + textwrap.dedent(body))
    return [sys.executable, str(path)]


@pytest.mark.parametrize(
    ("code", "verdict"),
    [
        (0, V.PASS),
        (1, V.FAIL),
        (124, V.FAIL),
        (125, V.CANNOT_TEST),
        (126, V.CANNOT_TEST),  # the shell's "not executable": nothing was measured
        (127, V.CANNOT_TEST),  # the shell's "not found"
    ],
)
def test_exit_codes_map_like_git_bisect_run(tmp_path, code, verdict):
    runner = TestCommandRunner(script(tmp_path, f"sys.exit({code})"))
    result = runner.run({}, 0, tmp_path / "trial")
    assert result.verdict is verdict
    assert result.details["exit_code"] == code
    assert result.log_path and (tmp_path / "trial" / "test-cmd.log").exists()


@pytest.mark.parametrize(
    "body",
    ["sys.exit(128)", "sys.exit(200)", "import signal; os.kill(os.getpid(), signal.SIGTERM)"],
)
def test_exit_128_and_above_or_a_signal_aborts_the_bisect(tmp_path, body):
    runner = TestCommandRunner(script(tmp_path, body))
    with pytest.raises(BisectError, match="aborting the bisect"):
        runner.run({}, 0, tmp_path / "trial")


def test_registry_patches_travel_in_the_wire_format(tmp_path):
    out = tmp_path / "env.txt"
    runner = TestCommandRunner(
        script(
            tmp_path,
            f"""
        open({str(out)!r}, "w").write(os.environ["DSV4BISECT_PATCHES"] + "|"
            + os.environ["DSV4BISECT_SEED_BLOCK"] + "|" + os.environ["DSV4BISECT_TRIAL_DIR"])
    """,
        )
    )
    runner.run({"trtllm-clamp": "alpha", "mma-decode": "merge-no-rescale"}, 3, tmp_path / "t")
    patches, block, trial_dir = out.read_text().split("|")
    assert patches == "mma-decode:merge-no-rescale,trtllm-clamp"  # registry order, bare default
    assert block == "3" and trial_dir == str(tmp_path / "t")
    assert runner.wire({"zeta": "on", "alpha": "v2"}) == "alpha:v2,zeta"  # not registry names


def test_a_shell_string_runs_through_the_shell(tmp_path):
    runner = TestCommandRunner('test -n "$DSV4BISECT_PATCHES" && exit 3 || exit 0')
    assert runner.run({"mhc-bf16": "bf16"}, 0, tmp_path / "a").verdict == V.FAIL
    assert runner.run({}, 0, tmp_path / "b").verdict == V.PASS


def test_a_hanging_command_times_out_as_cannot_test(tmp_path):
    runner = TestCommandRunner(script(tmp_path, "time.sleep(30)"), timeout_s=0.5)
    result = runner.run({}, 0, tmp_path / "trial")
    assert result.verdict == V.CANNOT_TEST and result.signature == "timeout"
    assert result.duration_s < 10


def test_fingerprints_name_the_command_and_the_patch_set(tmp_path):
    a = TestCommandRunner(["./check.sh"])
    b = TestCommandRunner(["./other.sh"])
    assert isinstance(a, Runner)
    assert a.fingerprint({"x": "1", "y": "2"}) == a.fingerprint({"y": "2", "x": "1"})
    assert a.fingerprint({"x": "1"}) != a.fingerprint({"x": "2"})
    assert a.fingerprint({"x": "1"}) != b.fingerprint({"x": "1"})
    assert a.probe_hash != b.probe_hash


def test_a_missing_command_cannot_test(tmp_path):
    result = TestCommandRunner([str(tmp_path / "nope")]).run({}, 0, tmp_path / "trial")
    assert result.verdict is V.CANNOT_TEST and "cannot run the test command" in \
        result.details["why"]
    with pytest.raises(BisectError, match="empty"):
        TestCommandRunner([])
