"""`dsv4bisect doctor --sglang-src` on every verified release's wheel, and on the newest one
relabelled as a release nobody verified."""

from __future__ import annotations

import json
import re
import zipfile

import pytest
from typer.testing import CliRunner
from wheels import wheel_of

from dsv4bisect.base.versions import NEWEST_VERIFIED
from dsv4bisect.cli import app


def doctor(*args: str):
    return CliRunner().invoke(app, ["doctor", *args, "--json"])


def test_doctor_passes_every_verified_release(wheel):
    latest = "0.5.23" in wheel.name  # the shipped -latest profile is pinned to the newest
    for profile in ((), ("dsv4-flash-tp8-latest-all",)) if latest else ((),):
        res = doctor(*profile, "--sglang-src", str(wheel))
        rows = json.loads(res.stdout)
        bad = [r for r in rows if r["status"] == "fail"]
        assert res.exit_code == 0 and not bad, bad
        assert "verified, hook layout" in rows[0]["detail"]
        flags = next(r for r in rows if r["name"].endswith("on SM120 (DeepSeek-V4)"))
        assert "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=True" in flags["detail"]


@pytest.fixture(scope="module")
def relabelled(tmp_path_factory):
    """The newest wheel's Python source as a source tree whose version file says 0.5.99."""
    root = tmp_path_factory.mktemp("sglang-next")
    with zipfile.ZipFile(wheel_of(NEWEST_VERIFIED)) as z:
        z.extractall(root, [n for n in z.namelist() if n.startswith("sglang/")
                            and n.endswith(".py")])
    version = root / "sglang" / "_version.py"
    version.write_text(re.sub(r"'\d+\.\d+\.\d+'", "'0.5.99'", version.read_text()))
    return root


def test_an_unverified_release_is_refused_in_one_line(relabelled):
    res = CliRunner().invoke(app, ["doctor", "--sglang-src", str(relabelled)])
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.exit_code == 1
    assert lines == [f"error: SGLang 0.5.99 is not a verified release (newest verified: "
                     f"{NEWEST_VERIFIED})"]


def test_the_opt_in_turns_the_refusal_into_a_warning(relabelled):
    res = doctor("--sglang-src", str(relabelled), "--allow-unverified-sglang")
    rows = json.loads(res.stdout)
    assert res.exit_code == 0, [r for r in rows if r["status"] == "fail"]
    assert rows[0]["status"] == "warn" and "unverified" in rows[0]["detail"]


def test_a_moved_target_is_named_where_it_went(relabelled):
    from dsv4bisect.plugin.static import SourceTree

    found = SourceTree(relabelled).resolve(
        "sglang.srt.layers.attention.flash_mla_sm120.flash_mla_with_kvcache_sm120")
    assert isinstance(found, str) and "`srt` is not defined" not in found
    assert "now defined at sglang.kernels.ops.attention.flash_mla_sm120." in found
