"""`dsv4bisect switches`: the shipped catalog of a profile's release (default: the newest
verified), as a table or JSON; bad input is one `error:` line and exit 5. Reading a wheel
(`--sglang-src`) is tested with the wheels in tests/sglang/test_switch_catalog.py."""

from __future__ import annotations

import json
from pathlib import Path

from dsv4bisect.base.versions import NEWEST_VERIFIED

MUST = {"SGLANG_OPT_FP8_WO_A_GEMM", "SGLANG_OPT_USE_TILELANG_INDEXER",
        "SGLANG_OPT_FUSE_MHC_POST_PRE", "SGLANG_DSV4_FP4_EXPERTS"}


def test_json_of_the_newest_release_by_default(cli) -> None:
    got = cli("switches", "--json")
    assert got.returncode == 0, got.stderr
    data = json.loads(got.stdout)
    assert data["release"] == NEWEST_VERIFIED
    assert MUST <= {s["name"] for s in data["switches"]}


def test_a_profile_picks_its_release_and_the_table_its_architecture(cli) -> None:
    got = cli("switches", "dsv4-flash-tp8")  # SGLang 0.5.13 on sm120
    assert got.returncode == 0, got.stderr
    assert "SGLang 0.5.13:" in got.stdout and "defaults on sm120" in got.stdout
    assert "SGLANG_SM120_FLASHMLA_BACKEND" not in got.stdout  # 0.5.15+
    row = next(line for line in got.stdout.splitlines() if "SGLANG_OPT_FP8_WO_A_GEMM" in line)
    assert "false (forced)" in row  # forced off on SM120 before 0.5.21


def test_bad_input_is_one_error_and_exit_5(cli, tmp_path: Path) -> None:
    (tmp_path / "not-a.whl").write_text("x")
    # (`switches reference` lists the embedded engine's catalog: tests/bisect/
    # test_config_question.py)
    for args in (("switches", "no-such-profile"),
                 ("switches", "--sglang-src", str(tmp_path / "missing")),
                 ("switches", "--sglang-src", str(tmp_path / "not-a.whl")),
                 ("switches", "--sglang-src", str(tmp_path))):
        got = cli(*args)
        assert got.returncode == 5, (args, got.stderr)
        assert got.stderr.startswith("error: ") and "\nhint: " in got.stderr, got.stderr
        assert "Traceback" not in got.stderr
