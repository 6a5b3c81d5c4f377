"""`dsv4bisect microtest` through the CLI entry point: exit codes, --json, the run directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4bisect.cli import app, main
from dsv4bisect.cli import microtest as microtest_cli


@pytest.fixture(autouse=True)
def _registered() -> None:
    """The command as `cli/__init__.py` registers it (added here if that is not wired yet)."""
    if not any(c.name == "microtest" for c in app.registered_commands):
        microtest_cli.register(app)


def call(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["microtest", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_pass_with_json_and_run_directory(tmp_path: Path, capsys) -> None:
    code, out, err = call(["mhc-bf16", "mma-decode", "--checkpoint", "random", "--layers", "3",
                           "--contexts", "1k,4k", "--json", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["verdict"] == "PASS" and data["exit_code"] == 0
    assert {r["patch"] for r in data["rows"]} == {"mhc-bf16", "mma-decode"}
    assert data["setup"]["layers"] == [3] and data["setup"]["contexts"] == [1024, 4096]
    md = (tmp_path / "microtest.md").read_text()
    assert "# dsv4bisect microtest: PASS" in md and "## mma-decode" in md
    assert json.loads((tmp_path / "microtest.json").read_text())["rows"] == data["rows"]
    assert "PASS: 0 of" in err  # the summary line on stderr; stdout holds only the JSON


def test_fail_exits_1(tmp_path: Path, capsys) -> None:
    code, out, err = call(["mma-decode:merge-no-rescale", "--checkpoint", "random", "--layers",
                           "3", "--contexts", "4k", "--out", str(tmp_path)], capsys)
    assert code == 1 and out == ""
    assert "FAIL: 1 of" in err and "**FAIL**" in (tmp_path / "microtest.md").read_text()


def test_marlin_nvfp4_flagged_triton_passes(tmp_path: Path, capsys) -> None:
    base = ["hash-topk-scaling", "nvfp4-dispatch", "--checkpoint", "random", "--layers", "0",
            "--out", str(tmp_path)]
    assert call([*base, "--moe-backend", "marlin"], capsys)[0] == 1
    assert call([*base, "--moe-backend", "triton"], capsys)[0] == 0


@pytest.mark.parametrize("args,message", [
    (["mhc-bf17", "--checkpoint", "random"], "unknown patch `mhc-bf17`"),
    (["--checkpoint", "random", "--layers", "9"], "out of range"),
    (["--checkpoint", "random", "--contexts", "8q"], "bad context length"),
    (["--checkpoint", "random", "--moe-backend", "tritonn"], "unknown MoE runner"),
    (["--checkpoint", "/nonexistent/ckpt"], "has no config.json"),
])
def test_bad_input_exits_5(args: list[str], message: str, capsys) -> None:
    code, _, err = call(args, capsys)
    assert code == 5 and message in err and "hint:" in err


def test_command_module_imports_without_torch() -> None:
    code = ("import sys, dsv4bisect.cli.microtest, dsv4bisect.microtest.spec, "
            "dsv4bisect.microtest.results, dsv4bisect.microtest.markdown; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
