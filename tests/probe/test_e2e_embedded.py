"""End to end against the embedded engine's real HTTP server (`dsv4bisect serve`, random tiny
weights): an A/A PASSes, the split-K merge fault is not a PASS, and the `probe` command works on
a saved baseline and on live servers with git-bisect exit codes.

Random weights retrieve nothing, so the accuracy families carry no evidence and drift decides;
the verdict must say so.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import typer
from typer.testing import CliRunner

from dsv4bisect.cli.probe import register
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import collect, judge
from dsv4bisect.probe.spec import tier_spec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SPEC = tier_spec("ci")
FAULT = "mma-decode:merge-no-rescale"

# Until the lead's CLI registers `serve`, start it through a minimal Typer app (same command).
_FALLBACK = ("import sys, typer\nfrom dsv4bisect.cli.serve import register\n"
             "app = typer.Typer(add_completion=False)\n@app.callback()\ndef _r() -> None: pass\n"
             "register(app)\napp(args=sys.argv[1:])\n")


def _serve_argv() -> list[str]:
    from dsv4bisect.cli import app

    if any(c.name == "serve" for c in app.registered_commands):
        return [sys.executable, "-m", "dsv4bisect", "serve"]
    return [sys.executable, "-c", _FALLBACK, "serve"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_embedded(patches: str, *extra: str) -> Iterator[str]:
    """An embedded server on the random model with DSV4BISECT_PATCHES = `patches` (fixture body);
    `extra`: more `serve` options."""
    port = _free_port()
    argv = [*_serve_argv(), "--port", str(port), "--device", "cpu", "--checkpoint", "random",
            *extra]
    proc = subprocess.Popen(argv, env={**os.environ, "DSV4BISECT_PATCHES": patches},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"server exited {proc.returncode}: {proc.stderr.read()}")
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):  # still starting (a loaded CPU)
                pass
            assert time.monotonic() < deadline, "server did not become healthy"
            time.sleep(0.3)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def clean_url() -> Iterator[str]:
    yield from start_embedded("")


@pytest.fixture(scope="module")
def fault_url() -> Iterator[str]:
    yield from start_embedded(FAULT)


@pytest.fixture(scope="module")
def baseline(clean_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[ProbeRun, ProbeRun]:
    out = tmp_path_factory.mktemp("probe-baseline")
    base = collect(clean_url, SPEC).save(out / "baseline")
    rep = collect(clean_url, SPEC, reference_run=base).save(out / "baseline-repeat")
    return base, rep


def _cli() -> typer.Typer:
    app = typer.Typer(add_completion=False)

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    return app


def test_aa_passes_with_identical_requests(baseline: tuple[ProbeRun, ProbeRun]) -> None:
    base, rep = baseline
    assert rep.cases == base.cases  # the repeat replays byte-identical conversations
    assert all(c.prompt_tokens == c.target for c in base.cases)
    assert {r["prompt_tokens"] for r in base.rows if r["family"] != "drift"} <= {
        c.prompt_tokens for c in base.cases}
    assert base.server["compress_ratios"] == [0, 0, 4, 16, 4, 16, 0]
    v = judge(base, rep, rep)
    assert v.verdict == "PASS", v.reasons
    assert v.aa["flips"] == 0 and v.drift["candidate"]["kl_mean"] == 0.0
    assert v.drift["candidate"]["top1_agreement"] == 1.0
    if not any(f.evidence for f in v.families.values()):  # random weights retrieve nothing
        assert any("no evidence" in r and "drift decides" in r for r in v.reasons)


@pytest.mark.slow  # a minute on a loaded 2-core machine: CI stays under 20 min
def test_split_k_merge_fault_is_not_a_pass(baseline: tuple[ProbeRun, ProbeRun],
                                           fault_url: str) -> None:
    base, rep = baseline
    cand = collect(fault_url, SPEC, reference_run=base)
    v = judge(base, rep, cand)
    assert v.verdict in ("FAIL", "WARN"), v.reasons
    assert v.drift["status"] in ("fail", "warn")
    assert v.drift["candidate"]["first_divergence"] is not None


def test_cli_against_a_saved_baseline(baseline: tuple[ProbeRun, ProbeRun], fault_url: str,
                                      tmp_path: Path) -> None:
    base_dir = Path(baseline[0].path).parent  # holds baseline/ and baseline-repeat/
    result = CliRunner().invoke(_cli(), ["probe", fault_url, "--baseline", str(base_dir),
                                         "--json", "--out", str(tmp_path / "out"),
                                         "--warn-as", "warn"])
    assert result.exit_code in (1, 4), result.output
    data = json.loads(result.stdout)
    assert data["verdict"] in ("FAIL", "WARN") and data["exit_code"] == result.exit_code
    assert data["evidence"]["baseline"] == baseline[0].path
    # the baseline folder alone brings its A/A repeat; a drift WARN exits 0 by default (as
    # `run`: `git bisect run` counts 4 as bad), verdict.json keeps its code
    again = CliRunner().invoke(_cli(), ["probe", fault_url, "--baseline", baseline[0].path,
                                        "--json", "--out", str(tmp_path / "again")])
    data2 = json.loads(again.stdout)
    assert data2["evidence"]["baseline_repeat"] == baseline[1].path
    assert again.exit_code == {"FAIL": 1, "WARN": 0}[data2["verdict"]], again.output
    assert data2["exit_code"] == {"FAIL": 1, "WARN": 4}[data2["verdict"]]
    assert data["evidence"]["candidate"] == str(tmp_path / "out" / "candidate")
    saved = json.loads((tmp_path / "out" / "verdict.json").read_text())
    assert saved["verdict"] == data["verdict"]
    assert ProbeRun.load(tmp_path / "out" / "candidate").spec == SPEC


@pytest.mark.slow
def test_cli_live_baseline_pass(clean_url: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(_cli(), ["probe", clean_url, "--baseline", clean_url,
                                         "--tier", "ci", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert {p.name for p in tmp_path.iterdir()} >= {"baseline", "baseline-repeat", "candidate",
                                                    "verdict.json"}


def test_warm_arm_and_unsupported_thinking(clean_url: str) -> None:
    spec = SPEC.replace(families=("needle",), lengths=(256,), cases_per_cell=1,
                        arms=("cold", "warm"), thinking=True, thinking_max_tokens=16)
    run = collect(clean_url, spec)
    arms = [r["arm"] for r in run.rows]
    assert arms == ["cold", "warm"]  # the embedded engine has no thinking mode
    cold, warm = run.rows
    assert cold["output"] == warm["output"] and cold["prompt_tokens"] == warm["prompt_tokens"]
    assert any(n.startswith("thinking arm skipped") for n in run.notes)
