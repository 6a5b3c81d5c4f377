"""Planted secrets against every printing path (issue 40, item 6).

The audit's set: an all-digit `API_KEY`, names outside the old list (`BEARER`, `JWT`,
`PASSPHRASE`, `SIGNATURE`, a `_PWD`), a URL password, `--api-key` (all digits) and `--hf-token`
in the engine's args, and a test command's `--api-key`. None may appear in `profile show` (every
format), `profile validate`, `diff-config`, a run's `run.json` and report (terminal, JSON,
markdown), or anything a real `--test-cmd` bisect prints or leaves in its run directory —
except `bisect.json` and the ledger, which hold what `--resume` replays and are readable by
their owner only (mode 0600); the resume then replays them.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_inproc import cli

from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.probe.spec import tier_spec
from dsv4bisect.probe.verdict import Verdict
from dsv4bisect.run.record import RunRecord

pytestmark = pytest.mark.timeout(600)

ENV = {"API_KEY": "12345678", "MY_BEARER": "bearer-AAAA1111", "JWT": "jwt-BBBB2222",
       "DB_PASSPHRASE": "pass-CCCC3333", "REQ_SIGNATURE": "sig-DDDD4444",
       "DB_PWD": "pwd-HHHH8888", "DATABASE_URL": "postgres://u:urlpw-EEEE5555@h/db"}
ARGS = ["--api-key", "98765432", "--hf-token", "hf-FFFF6666"]
TEST_CMD_KEY = "tcmd-GGGG7777"
SECRETS = ("12345678", "bearer-AAAA1111", "jwt-BBBB2222", "pass-CCCC3333", "sig-DDDD4444",
           "pwd-HHHH8888", "urlpw-EEEE5555", "98765432", "hf-FFFF6666", TEST_CMD_KEY)
SETS = (*(f"engine.env.{k}={v}" for k, v in ENV.items()),
        'engine.args=[--api-key, "98765432", --hf-token, hf-FFFF6666]')


def leaked(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    path = tmp_path / "planted.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "name": "planted",
                                    "extends": "reference", "engine": {"env": ENV,
                                                                       "args": ARGS}}))
    return path


def test_profile_and_diff_outputs(profile: Path) -> None:
    p = str(profile)
    sets = [x for s in SETS for x in ("--set", s)]
    for command in (("profile", "show", p), ("profile", "show", p, "--json"),
                    ("profile", "show", p, "--why"), ("profile", "show", p, "--resolved"),
                    ("profile", "show", p, "--resolved", "--json"),
                    ("profile", "show", "reference", "--resolved", "--json", *sets),
                    ("profile", "show", "reference", "--why", *sets),
                    ("profile", "validate", p), ("diff-config", p, "reference"),
                    ("diff-config", "reference", p, "--json")):
        result = cli(*command)
        result.assert_clean()
        assert not leaked(result.out + result.err), command


# main's newer engine shapes: a PD profile's per-role env and args (the router's too), and a
# vLLM profile (`vllm serve --api-key`); `--resolved` prints every process's argv and env
ROLE_SECRETS = {"prefill": ({"MY_BEARER": ENV["MY_BEARER"]}, ARGS[:2]),
                "decode": ({"JWT": ENV["JWT"]}, ARGS[2:]),
                "router": ({"DB_PWD": ENV["DB_PWD"]}, None)}


@pytest.mark.parametrize("base", ["reference-pd", "dsv4-flash-vllm-tp8"])
def test_pd_roles_and_vllm_profiles(tmp_path: Path, base: str) -> None:
    engine: dict = {"env": {"API_KEY": ENV["API_KEY"], "DB_PASSPHRASE": ENV["DB_PASSPHRASE"]}}
    if base == "reference-pd":
        engine["pd"] = {role: {"env": env, **({"args": args} if args else {})}
                        for role, (env, args) in ROLE_SECRETS.items()}
    else:
        engine["args"] = ARGS
        engine["env"] |= {"MY_BEARER": ENV["MY_BEARER"]}
    path = tmp_path / "planted.yaml"
    path.write_text(yaml.safe_dump({"schema_version": 1, "name": "planted", "extends": base,
                                    "engine": engine}))
    p = str(path)
    planted = 0
    for command in (("profile", "show", p), ("profile", "show", p, "--json"),
                    ("profile", "show", p, "--why"), ("profile", "show", p, "--resolved"),
                    ("profile", "show", p, "--resolved", "--json"),
                    ("diff-config", p, base), ("diff-config", base, p, "--json")):
        result = cli(*command)
        result.assert_clean()
        assert not leaked(result.out + result.err), command
        planted += result.out.count("***")
    assert planted  # the secrets were there to hide


def test_a_run_directory_and_its_report(tmp_path: Path) -> None:
    run = tmp_path / "run"
    overrides = Overrides(sets=SETS)
    cfg = resolve("reference", overrides)
    command = ["dsv4bisect", "run", "reference", *(x for s in SETS for x in ("--set", s))]
    RunRecord.begin(run, command=command, profile="reference", overrides=overrides,
                    good_overrides=Overrides(sets=SETS, only=()), use_cache=False,
                    spec=tier_spec("ci"), good=cfg, candidate=cfg)
    for arm in ("baseline", "candidate"):
        (run / arm).mkdir()
        (run / arm / "config.json").write_text(json.dumps(cfg.to_json(redact=False)))
    (run / "verdict.json").write_text(json.dumps(
        Verdict("FAIL", (f"candidate failed with --set {SETS[0]}",), {"tier": "ci"}).to_dict()))
    assert not leaked((run / "run.json").read_text())
    for fmt in ((), ("--json",), ("--format", "md")):
        result = cli("report", str(run), *fmt)
        result.assert_clean()
        assert not leaked(result.out + result.err), fmt


def test_a_test_cmd_bisect_prints_none_and_keeps_its_replay_private(tmp_path: Path) -> None:
    script = tmp_path / "tc.sh"
    script.write_text('#!/bin/sh\ncase "$DSV4BISECT_PATCHES" in *mma-decode*) exit 1;; esac\n'
                      "exit 0\n")
    script.chmod(0o755)
    env = {**os.environ, "DSV4BISECT_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}

    def dsv4bisect(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dsv4bisect", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)

    sets = [x for s in SETS for x in ("--set", s)]
    test_cmd = f"./tc.sh --api-key {TEST_CMD_KEY}"
    printed = ""
    for fmt in ((), ("--json",)):
        out = tmp_path / f"runs{len(fmt)}"
        done = dsv4bisect("bisect", "reference-all", "--bad", "mhc-bf16,mma-decode", "--out",
                          str(out), *sets, "--test-cmd", test_cmd, *fmt)
        assert done.returncode == 0, done.stderr[-2000:]
        printed += done.stdout + done.stderr
    run = next(p for p in (tmp_path / "runs1").iterdir() if p.is_dir())
    for fmt in ((), ("--json",), ("--format", "md")):
        shown = dsv4bisect("report", str(run), *fmt)
        printed += shown.stdout + shown.stderr
    assert not leaked(printed)
    private = {run / "bisect.json", tmp_path / "runs1" / "ledger.sqlite"}
    for path in private:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for path in (tmp_path / "runs1").rglob("*"):
        if path.is_file() and path not in private and path.name != "test-cmd.log":
            assert not leaked(path.read_bytes().decode("utf-8", "replace")), path
    resumed = dsv4bisect("bisect", "--resume", str(run), "--json")  # replays the private file
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads(resumed.stdout)["culprits"] == ["mma-decode"]
    assert not leaked(resumed.stdout + resumed.stderr)
