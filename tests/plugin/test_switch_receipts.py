"""An upstream switch's receipt: installed only if SGLang kept the value we asked for."""

from __future__ import annotations

import sys

import pytest

from dsv4bisect.base.versions import check_version
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.plugin.install import install_patches
from dsv4bisect.plugin.receipts import ProcessInfo, ReceiptWriter

PROC = ProcessInfo(pid=1, role="server", kind="scheduler", tp_rank=0, dp_rank=0, pp_rank=0)


@pytest.fixture(autouse=True)
def _no_sglang_left():
    """The installer's contract observer tries to import SGLang; under pytest `tests/sglang/`
    can be found as a namespace package named `sglang`: leave nothing behind for the
    synthetic-tree tests."""
    yield
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]


def install(tmp_path, patches):
    return install_patches(patches, check_version("0.5.23"), ReceiptWriter(tmp_path, PROC),
                           builtin_patches())


def test_a_switch_that_sglang_kept_is_installed_and_expects_no_call(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BISECT_SWITCHES", "SGLANG_OPT_FUSE_MHC_POST_PRE=1")
    monkeypatch.setenv("SGLANG_OPT_FUSE_MHC_POST_PRE", "True")  # how SGLang's envs writes it
    rec = install(tmp_path, {"fused-mhc-post-pre": "fused"})[0]
    assert (rec.state, rec.expects_call) == ("installed", [])


def test_a_switch_sglang_changed_is_refused_with_both_values(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BISECT_SWITCHES", "SGLANG_OPT_FP8_WO_A_GEMM=1")
    monkeypatch.setenv("SGLANG_OPT_FP8_WO_A_GEMM", "False")  # e.g. no DeepGEMM JIT on the node
    rec = install(tmp_path, {"fp8-wo-a-gemm": "fp8"})[0]
    assert rec.state == "refused" and "asked 1, SGLang has False" in rec.reason


def test_a_switch_launched_outside_dsv4bisect_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("DSV4BISECT_SWITCHES", raising=False)
    rec = install(tmp_path, {"tilelang-indexer": "tilelang"})[0]
    assert rec.state == "refused" and "DSV4BISECT_SWITCHES" in rec.reason


def test_a_switch_the_release_does_not_have_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BISECT_SWITCHES", "SGLANG_OPT_USE_FLASHINFER_MHC=1")
    recs = install_patches({"flashinfer-mhc": "tf32"}, check_version("0.5.14"),
                           ReceiptWriter(tmp_path, PROC), builtin_patches())
    assert recs[0].state == "refused" and "0.5.14" in recs[0].reason
