"""`dsv4bisect bisect` through the real CLI process: bad input, `--plan`, and `--test-cmd`
bisects that name a single culprit and an interacting pair (fast: the check is a script)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CHECK = HERE / "fake_check.py"  # exits 1 when every listed culprit is in DSV4BISECT_PATCHES
NOISELESS = ("--false-fail", "0", "--false-pass", "0")


def check_cmd(log: Path, culprits: str) -> str:
    return f"{sys.executable} {CHECK} {log} {shlex.quote(culprits)}"


def calls(log: Path) -> int:
    return sum(line.startswith("start") for line in log.read_text().splitlines()) \
        if log.exists() else 0


def assert_bad_input(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode == 5, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-2].startswith("error:") and lines[-1].startswith("hint:"), r.stderr
    assert "Traceback" not in r.stderr
    for word in words:
        assert word in r.stderr


def test_unknown_candidate_is_bad_input(cli, tmp_path: Path) -> None:
    r = cli("bisect", "--candidates", "mma-decod", "--test-cmd", "true", "--out", tmp_path / "runs",
            cwd=tmp_path)
    assert_bad_input(r, "unknown patch `mma-decod`", "did you mean `mma-decode`")
    assert not (tmp_path / "runs").exists()


def test_relative_drift_outside_a_hot_bisect_is_bad_input(cli, tmp_path: Path) -> None:
    for extra in (("--fresh-launches",), ("--test-cmd", "true")):
        r = cli("bisect", "--drift", "relative", *extra, "--out", tmp_path / "runs", cwd=tmp_path)
        assert_bad_input(r, "--drift relative judges the sequential trial probe")
    assert not (tmp_path / "runs").exists()


def test_equal_ends_are_bad_input(cli, tmp_path: Path) -> None:
    r = cli("bisect", "--good", "mma-decode", "--bad", "mma-decode", "--test-cmd", "true",
            "--out", tmp_path / "runs", cwd=tmp_path)
    assert_bad_input(r, "the good and bad ends are the same configuration")
    assert not (tmp_path / "runs").exists()


def test_a_candidate_that_does_not_differ_is_bad_input(cli, tmp_path: Path) -> None:
    r = cli("bisect", "--good", "mma-decode", "--candidates", "mma-decode", "--test-cmd", "true",
            "--out", tmp_path / "runs", cwd=tmp_path)
    assert_bad_input(r, "`mma-decode` is the same at the good and bad ends")


def test_resume_of_a_directory_that_is_not_a_bisect_is_bad_input(cli, tmp_path: Path) -> None:
    (tmp_path / "somerun").mkdir()
    (tmp_path / "somerun" / "run.json").write_text('{"schema": "dsv4bisect.run/1"}')
    r = cli("bisect", "--resume", tmp_path / "somerun", cwd=tmp_path)
    assert_bad_input(r, "is not a bisect run directory")


def test_plan_prints_numbers_and_launches_nothing(cli, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    r = cli("bisect", "--plan", "--test-cmd", check_cmd(log, "mma-decode"), "--probe-cost", "30",
            "--out", tmp_path / "runs", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "candidates (5): mhc-bf16, hash-topk-scaling, mma-decode" in r.stderr
    assert "left out: trtllm-clamp (inert:" in r.stderr
    assert "expected launches" in r.stderr and "P(correct)" in r.stderr
    assert "test command: 30 s — given (--probe-cost)" in r.stderr  # each cost, its source
    assert "launch: 0 s — none: a test command" in r.stderr
    assert "priced design: saves" in r.stderr and "hot switching: off here" in r.stderr
    assert "without any lever" in r.stderr and "nothing was launched" in r.stderr
    as_json = cli("bisect", "--plan", "--json", "--test-cmd", check_cmd(log, "mma-decode"),
                  "--probe-cost", "30", "--launch-cost", "10", "--out", tmp_path / "runs",
                  cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    p = json.loads(as_json.stdout)
    assert p["n_candidates"] == 5 and 2 < p["mean_trials"] < 30
    assert p["p90_wall_s"] >= p["mean_wall_s"] * 0.5 and 0.9 <= p["p_correct"] <= 1
    # a test command: every trial (the remedy check's too) is one launch + one call
    assert p["mean_launches"] == pytest.approx(p["mean_trials"])
    assert p["mean_wall_s"] == pytest.approx(p["mean_trials"] * 40, rel=1e-6)
    assert {c["name"]: c["source"] for c in p["costs"]} == {
        "launch": "given (--launch-cost)", "test command": "given (--probe-cost)"}
    assert p["levers"]["hot"] == {"available": False, "saves_s": 0.0}
    assert p["without_levers"]["mean_wall_s"] == pytest.approx(
        p["levers"]["priced"]["off"]["mean_wall_s"])  # the only lever a test command has
    assert not log.exists() and not (tmp_path / "runs").exists()


def _bisect(cli, tmp_path: Path, culprits: str, *extra: str) -> tuple[dict, Path]:
    log = tmp_path / "calls.log"
    r = cli("bisect", "--test-cmd", check_cmd(log, culprits), *NOISELESS, "--json",
            "--out", tmp_path / "runs", *extra, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "plan:" in r.stderr and "FOUND" in r.stderr
    report = json.loads(r.stdout)
    return report, Path(report["run_dir"])


@pytest.mark.slow  # plans of the standard tier: ~1 min of simulation on 2 cores (issue 42's 400 runs)
def test_plan_costs_a_trial_by_the_ledger_once_trials_were_measured(cli, tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    cmd = check_cmd(log, "mma-decode")
    before = cli("bisect", "--plan", "--test-cmd", cmd, "--out", tmp_path / "runs", cwd=tmp_path)
    assert before.returncode == 0, before.stderr
    assert "test command: 60 s — assumed (dsv4bisect default for a --test-cmd)" in before.stderr
    ran = cli("bisect", "--test-cmd", cmd, *NOISELESS, "--out", tmp_path / "runs", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    after = cli("bisect", "--plan", "--test-cmd", cmd, "--out", tmp_path / "runs", cwd=tmp_path)
    assert after.returncode == 0, after.stderr
    assert re.search(r"test command: \d+ s — measured: median of \d+ trials in the ledger",
                     after.stderr), after.stderr


def test_test_cmd_finds_a_single_culprit_and_writes_the_report(cli, tmp_path: Path) -> None:
    report, run_dir = _bisect(cli, tmp_path, "triton-indexer")
    assert report["status"] == "found" and report["culprits"] == ["triton-indexer"]
    assert report["posterior"] >= 0.95
    for name in ("bisect.json", "report.md", "report.json", "posterior.png"):
        assert (run_dir / name).exists(), name
    _posterior_ticks_are_whole_trials(run_dir)
    trials = report["trials"]
    assert trials[0]["subset"] == [] and trials[0]["verdict"] == "PASS"
    # a test command's bad end is checked by the first trial that fails, not run by itself
    assert all(len(t["subset"]) < 5 for t in trials)
    assert any(t["verdict"] == "FAIL" for t in trials)
    assert report["remedy"] == {"subset": ["hash-topk-scaling", "mhc-bf16", "mma-decode",
                                           "nvfp4-dispatch"], "verdict": "passes",
                                "outcomes": ["pass"], "trials_run": 0}  # a search trial
    assert len(trials) == calls(tmp_path / "calls.log") <= 6
    assert all(t["reproduce"].startswith("DSV4BISECT_PATCHES=") for t in trials)
    md = (run_dir / "report.md").read_text()
    assert md.startswith("# dsv4bisect bisect: found — culprit {triton-indexer}")
    assert "| patches | `triton-indexer` | off | bf16 |" in md  # diff-config of the neighbours
    again = cli("report", run_dir, "--json", timeout=60)
    assert again.returncode == 0 and json.loads(again.stdout)["culprits"] == ["triton-indexer"]


def test_two_independent_culprits_are_named_as_several(cli, tmp_path: Path) -> None:
    # Each fails alone: the search names one, the bad end without it fails twice (the remedy
    # check), so every candidate is run alone and both are named, the good end having passed.
    r = cli("bisect", "--test-cmd", check_cmd(tmp_path / "calls.log",
                                              "hash-topk-scaling|nvfp4-dispatch"),
            *NOISELESS, "--json", "--out", tmp_path / "runs", cwd=tmp_path)
    assert r.returncode == 0 and "SEVERAL" in r.stderr, r.stderr
    report = json.loads(r.stdout)
    run_dir = Path(report["run_dir"])
    assert report["status"] == "several"
    assert report["culprits"] == ["hash-topk-scaling", "nvfp4-dispatch"]
    assert report["remedy"]["verdict"] == "passes"  # the bad end without both
    assert "several culprits" in (run_dir / "report.md").read_text()


def test_test_cmd_finds_an_interacting_pair(cli, tmp_path: Path) -> None:
    report, _ = _bisect(cli, tmp_path, "mhc-bf16,nvfp4-dispatch")
    assert report["culprits"] == ["mhc-bf16", "nvfp4-dispatch"]
    checks = {c["member"]: c["confirmed"] for c in report["checks"] if c["member"]}
    assert checks == {"mhc-bf16": True, "nvfp4-dispatch": True}  # each member needed


def test_a_second_bisect_of_the_same_question_launches_nothing(cli, tmp_path: Path) -> None:
    first, _ = _bisect(cli, tmp_path, "mma-decode")
    before = calls(tmp_path / "calls.log")
    second, _ = _bisect(cli, tmp_path, "mma-decode")
    assert calls(tmp_path / "calls.log") == before
    assert second["culprits"] == first["culprits"] == ["mma-decode"]
    assert {t["source"] for t in second["trials"]} == {"ledger"}
    assert second["bound"]["launches"] == 0


def test_ends_that_do_not_differ_exit_1(cli, tmp_path: Path) -> None:
    r = cli("bisect", "--test-cmd", "true", *NOISELESS, "--out", tmp_path / "runs", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "the bad end passes" in r.stderr


def test_a_good_end_that_cannot_be_tested_exits_125(cli, tmp_path: Path) -> None:
    r = cli("bisect", "--test-cmd", "exit 125", *NOISELESS, "--out", tmp_path / "runs",
            cwd=tmp_path)
    assert r.returncode == 125, r.stderr
    assert "UNTESTABLE" in r.stderr


@pytest.mark.slow
def test_a_deterministic_test_cmd_bisect_of_reference_all_is_short_with_default_settings(
        cli, tmp_path: Path) -> None:
    """Default settings (5 %/5 % assumed noise: a test command is not declared noiseless), one
    culprit among the five candidates: every call counted, the end checks and the remedy check
    included. Before the priced design: 6, 6, 7, 7, 8 (6.8); with it and both ends run first:
    5, 6, 6, 7, 7 (6.2); with the bad end checked by the first FAIL: 4, 5, 5, 6, 7 (5.4)."""
    counts = {}
    for culprit in ("mhc-bf16", "hash-topk-scaling", "mma-decode", "triton-indexer",
                    "nvfp4-dispatch"):
        log = tmp_path / f"{culprit}.log"
        r = cli("bisect", "--test-cmd", check_cmd(log, culprit), "--json", "--out",
                tmp_path / culprit, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["culprits"] == [culprit] and report["remedy"]["verdict"] == "passes"
        counts[culprit] = calls(log)
    assert counts == {"mhc-bf16": 4, "hash-topk-scaling": 5, "mma-decode": 5,
                      "triton-indexer": 6, "nvfp4-dispatch": 7}
    assert sum(counts.values()) / 5 <= 6, counts


@pytest.mark.slow  # plans of the standard tier: ~1 min of simulation on 2 cores (issue 42's 400 runs)
def test_plan_of_an_sglang_profile_prices_launches_switches_and_probes(cli, tmp_path: Path) -> None:
    r = cli("bisect", "dsv4-flash-tp8-latest-all", "--plan", "--json", "--out", tmp_path / "runs",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    sources = {c["name"]: c["source"] for c in p["costs"]}
    assert sources["launch"] == "assumed (dsv4bisect default for SGLang)"
    assert sources["hot switch"].startswith("assumed (dsv4bisect default for SGLang: drain")
    # cold at 1 and warm at 32 for every case (the warm replay computes every turn once), the
    # thinking arm on the needle cases, drift once: every prompt token computed
    assert "70.3 M computed prompt tokens" in sources["full probe (standard tier)"]
    assert "warm@32 29.9 M" in sources["full probe (standard tier)"]
    # sm120-flashmla-backend is hot: its import-time global is re-assigned (SglangRule.copies)
    assert p["load_time"] == ["fp8-wo-a-gemm", "fused-mhc-post-pre"]
    assert p["hot"] and p["levers"]["hot"]["available"] and p["phase_s"]["confirmation"] > 0
    assert p["without_levers"]["mean_wall_s"] > p["mean_wall_s"]
    for name in ("hot", "sequential", "priced"):
        off = p["levers"][name]["off"]["mean_wall_s"]
        assert p["levers"][name]["saves_s"] == pytest.approx(off - p["mean_wall_s"])
    fresh = cli("bisect", "dsv4-flash-tp8-latest-all", "--plan", "--json", "--fresh-launches",
                "--out", tmp_path / "runs", cwd=tmp_path)
    f = json.loads(fresh.stdout)
    assert not f["hot"] and not f["levers"]["hot"]["available"]
    assert not f["levers"]["sequential"]["available"]  # fresh trials are probed at full size
    # every trial a fresh launch, and a re-test also launches its seed block's baseline
    assert f["phase_s"]["confirmation"] == 0 and f["mean_launches"] >= f["mean_trials"]
    assert not (tmp_path / "runs").exists()


def _posterior_ticks_are_whole_trials(run_dir: Path) -> None:
    """Issue 31, item 3: posterior.png's x axis counts trials (no 0.5, 1.5 ticks)."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dsv4bisect.bisect.report import load_bisect, posterior_figure

    fig = posterior_figure(load_bisect(run_dir))
    ticks = [t for t in fig.axes[0].get_xticks() if 0 <= t <= len(load_bisect(run_dir).history)]
    plt.close(fig)
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
