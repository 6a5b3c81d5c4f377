"""Issue 41, items 5 and 7: what a run's report says a person ran and should run next.

report.md said `exit code 4` where `dsv4bisect run` had exited 0 (a drift WARN under the default
`--warn-as pass`): the line a person reads says the command's exit, verdict.json keeps the
verdict's code. After a FAIL or a WARN the terminal names the `bisect` command to run.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from dsv4bisect.cli.options import overrides
from dsv4bisect.config.resolve import resolve
from dsv4bisect.probe.verdict import Verdict
from dsv4bisect.report.commands import bisect_command, exit_words, next_step
from dsv4bisect.report.run_report import RunView, render_markdown, terminal_lines


def _view(verdict: str | None, *, exit_how: dict[str, str] | None, code: int | None = None,
          patches: dict[str, str] | None = None, run_dir: str = "runs/x") -> RunView:
    cand = patches if patches is not None else {"mhc-bf16": "bf16", "mma-decode": "split-k"}
    run: dict[str, Any] = {
        "schema": "dsv4bisect.run/1", "status": "done" if verdict else "error",
        "profile": "reference-all", "tier": "smoke", "probe": {"seed_block": 0},
        "overrides": {"sets": ["engine.precision=exact"], "enable": [], "disable": [],
                      "only": None},
        "arms": {"baseline": {"fingerprint": "aaaa", "patch_set": {}},
                 "candidate": {"fingerprint": "bbbb", "patch_set": cand}},
        "exit_code": code}
    if exit_how is not None:
        run["exit"] = exit_how
    v = Verdict(verdict, ("drift WARN",), {"tier": "smoke", "spec_hash": "s", "seed_block": 0}) \
        if verdict else None
    return RunView(Path(run_dir), run, v, {})


def test_report_md_says_the_exit_the_command_had() -> None:
    warn = _view("WARN", exit_how={"warn_as": "pass", "policy": "default"}, code=4)
    assert exit_words(warn) == ("exit 0 (a drift WARN under `--warn-as pass`; verdict.json "
                                "keeps the verdict's code 4)")
    assert "\n- exit 0 (a drift WARN" in render_markdown(warn)
    assert "exit code 4" not in render_markdown(warn)
    as_warn = _view("WARN", exit_how={"warn_as": "warn", "policy": "git-bisect"}, code=4)
    assert exit_words(as_warn) == "exit 4"
    fail = _view("FAIL", exit_how={"warn_as": "pass", "policy": "default"}, code=1)
    assert exit_words(fail) == "exit 1"
    error = _view(None, exit_how={"warn_as": "pass", "policy": "git-bisect"}, code=5)
    assert exit_words(error) == ("exit 125 (nothing was measured: `--exit-policy git-bisect`; "
                                 "the error's code 5)")
    trial = _view("WARN", exit_how=None, code=4)  # a bisect trial's run: no process exit
    assert exit_words(trial) == "the verdict's code 4"


def test_after_a_fail_or_warn_the_terminal_names_the_bisect_to_run() -> None:
    fail = _view("FAIL", exit_how={"warn_as": "pass", "policy": "default"}, code=1,
                 run_dir="/tmp/elsewhere/20261206-x")
    command = bisect_command(fail)
    assert command == ("dsv4bisect bisect reference-all --tier smoke --set "
                       "engine.precision=exact --out /tmp/elsewhere")
    lines = [text for text, _ in terminal_lines(fail)]
    assert lines[-1] == f"next: find which patch lost the facts: {command}"
    assert "## Next step" in render_markdown(fail) and command in render_markdown(fail)
    # the command's overrides resolve to the run's candidate: the bisect's bad end
    argv = shlex.split(command)
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert resolve(argv[2], overrides(None, None, None, sets)).patch_set == resolve(
        "reference-all", overrides(None, None, None, ["engine.precision=exact"])).patch_set
    default_root = _view("WARN", exit_how=None, code=4)
    assert "--out" not in (bisect_command(default_root) or "")
    assert next_step(default_root).startswith("next: find which patch drifts: ")
    one = _view("FAIL", exit_how=None, code=1, patches={"fp8-wo-a-gemm": "scale-layout"})
    assert bisect_command(one) is None
    assert next_step(one) == ("next: the candidate differs from its good end only in "
                              "fp8-wo-a-gemm:scale-layout: that patch lost the facts, there is "
                              "nothing to bisect")
    assert next_step(_view("PASS", exit_how=None, code=0)) is None
    assert next_step(_view(None, exit_how=None, code=5)) is None
