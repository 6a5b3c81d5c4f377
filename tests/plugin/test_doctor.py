"""`dsv4bisect doctor` against the real wheels (static) and this machine (no SGLang, no GPU)."""

from __future__ import annotations

import json
import os
import socket

import pytest
from typer.testing import CliRunner
from wheels import fetch_wheel

from dsv4bisect.cli import app
from dsv4bisect.cli import doctor as doctor_cli

if "doctor" not in {c.name for c in app.registered_commands}:
    doctor_cli.register(app)  # until the lead registers it in dsv4bisect.cli


def run(*args: str):
    return CliRunner().invoke(app, ["doctor", *args, "--json"])


@pytest.fixture(scope="module")
def wheel13():
    path, why = fetch_wheel("0.5.13")
    if path is None:
        pytest.skip(why)
    return path


def test_static_check_of_a_wheel_passes_every_target(wheel13):
    res = run("dsv4-flash-tp8-all", "--sglang-src", str(wheel13))
    rows = json.loads(res.stdout)
    assert rows[0]["detail"].startswith("0.5.13") and rows[0]["status"] == "ok"
    targets = [r for r in rows if ":" in r["name"] and r["name"].split(":")[0] in (
        "mhc-bf16", "hash-topk-scaling", "mma-decode", "triton-indexer", "nvfp4-dispatch",
        "trtllm-clamp", "(contract check)")]
    assert len(targets) >= 12 and all(r["status"] == "ok" for r in targets), targets
    assert res.exit_code == 0


def test_a_busy_port_fails_with_a_fix(wheel13, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        prof = tmp_path / "p.yaml"
        prof.write_text(f"schema_version: 1\nname: p\nextends: dsv4-flash-tp8\n"
                        f"engine:\n  port: {port}\n")
        res = run(str(prof), "--sglang-src", str(wheel13))
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert rows[f"port {port} (server)"]["status"] == "fail"
    assert f"PID {os.getpid()}" in rows[f"port {port} (server)"]["detail"]  # the holder named
    assert res.exit_code == 1


def test_without_sglang_here_it_says_what_to_install():
    res = run("dsv4-flash-tp8")
    rows = json.loads(res.stdout)
    assert rows[0]["name"] == "SGLang" and rows[0]["status"] == "fail"
    assert "install SGLang" in rows[0]["fix"] and res.exit_code == 1


def test_with_no_profile_it_checks_what_run_would_run():
    """Issue 41, item 8: `doctor` alone checked SGLang and failed on a laptop, where `run` and
    `bisect` default to reference-all on the embedded engine: it now checks that."""
    alone, default = run(), run("reference-all")
    assert alone.exit_code == 0, alone.stdout
    rows = json.loads(alone.stdout)
    assert [r["name"] for r in rows] == [r["name"] for r in json.loads(default.stdout)]
    assert [r["name"] for r in rows] == ["engine Python", "torch", "checkpoint embedded"]
    assert "SGLang" not in alone.stdout
    with_override = run("--only", "mma-decode")  # the overrides apply to that profile too
    assert with_override.exit_code == 0, with_override.stdout


def test_bad_source_path_is_bad_input(tmp_path):
    from dsv4bisect.errors import ConfigError

    res = CliRunner().invoke(app, ["doctor", "--sglang-src", str(tmp_path / "nope")])
    assert isinstance(res.exception, ConfigError)  # the CLI's main() turns it into exit 5
    assert res.exception.exit_code == 5
