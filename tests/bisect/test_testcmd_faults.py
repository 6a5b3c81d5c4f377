"""A test command that could not run measured nothing (issue 30, item 1): `bisect --resume` from
another directory used to run the recorded `--test-cmd ./tc.sh` there, get 127 ("not found"),
store every remaining trial as a FAIL and conclude GOOD-END-FAILS — a wrong answer the ledger
then gave every later bisect. Now the working directory is recorded and resumed in, and 126,
127 and a command that cannot start are CANNOT_TEST, never written as evidence."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dsv4bisect.bisect.trials.testcmd import NOT_RUN, TestCommandRunner
from dsv4bisect.probe import verdict as V

HERE = Path(__file__).parent
NOISELESS = ("--false-fail", "0", "--false-pass", "0")


def test_126_127_and_a_missing_working_directory_cannot_test(tmp_path: Path) -> None:
    script = tmp_path / "tc.sh"
    script.write_text("#!/bin/sh\nexit 0\n")  # not executable: the shell says 126
    for command, code in (("./tc.sh", 126), ("./absent.sh", 127)):
        result = TestCommandRunner(command, cwd=tmp_path).run({}, 0, tmp_path / "t")
        assert result.verdict is V.CANNOT_TEST and result.signature == NOT_RUN
        assert result.details["exit_code"] == code and str(tmp_path) in result.details["why"]
    gone = TestCommandRunner(["true"], cwd=tmp_path / "deleted").run({}, 0, tmp_path / "t")
    assert gone.verdict is V.CANNOT_TEST and gone.signature == NOT_RUN


def test_resume_from_another_directory_runs_the_command_where_it_was_started(
        cli, tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    log = home / "calls.log"
    # A relative test command that kills its bisect (SIGKILL, as a lost shell would) during
    # the third trial; the resume runs from another directory.
    (home / "tc.sh").write_text(
        "#!/bin/sh\n"
        f'n=$(grep -c "^start" {log} 2>/dev/null || echo 0)\n'
        f'if [ "$n" -ge 2 ] && [ ! -e {home}/killed ]; then touch {home}/killed; '
        # $PPID is the `sh -c` the runner started; its parent is the bisect
        "kill -9 $(cut -d' ' -f4 /proc/$PPID/stat); sleep 5; fi\n"
        f"exec {sys.executable} {HERE / 'fake_check.py'} {log} mma-decode\n")
    (home / "tc.sh").chmod(0o755)
    first = cli("bisect", "--test-cmd", "./tc.sh", *NOISELESS, "--out", home / "runs", cwd=home)
    assert first.returncode == -9, first.stderr[-2000:]
    (run_dir,) = [p for p in (home / "runs").iterdir() if "-bisect-" in p.name]
    assert json.loads((run_dir / "bisect.json").read_text())["request"]["test_cwd"] == str(home)
    resumed = cli("bisect", "--resume", run_dir, "--json", cwd=elsewhere)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    report = json.loads(resumed.stdout)
    assert report["status"] == "found" and report["culprits"] == ["mma-decode"]
    assert all(t["verdict"] in ("PASS", "FAIL") for t in report["trials"]), report["trials"]
    # A fresh bisect from the right directory reuses only real evidence from the ledger.
    fresh = cli("bisect", "--test-cmd", "./tc.sh", *NOISELESS, "--json", "--out", home / "runs",
                    cwd=home)
    assert fresh.returncode == 0 and json.loads(fresh.stdout)["culprits"] == ["mma-decode"]
