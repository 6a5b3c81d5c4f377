"""Which SGLang releases the plugin and doctor accept: every verified release maps to its own
hook layout; anything else is refused (or, opted in, allowed with a warning), never silently
given an older layout."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsv4bisect.base.versions import (
    LAYOUTS,
    NEWEST_VERIFIED,
    VERIFIED,
    check_version,
    detect_sglang,
    parse_version,
)
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.plugin.install import install_patches
from dsv4bisect.plugin.receipts import ProcessInfo, ReceiptWriter


def test_post_releases_keep_their_number_and_sort_between_releases():
    assert parse_version("0.5.13.post1") == (0, 5, 13, 1)
    assert parse_version("0.5.13") < parse_version("0.5.13.post1") < parse_version("0.5.14")
    assert parse_version("0.5.14rc0") == (0, 5, 14)
    assert parse_version("banana") is None


@pytest.mark.parametrize("version,layout", [
    ("0.5.13", "0.5.13"), ("0.5.13.post1", "0.5.13"), ("0.5.14", "0.5.14"),
    ("0.5.15.post1", "0.5.14"), ("0.5.16", "0.5.16"), ("0.5.18", "0.5.16"),
    ("0.5.19", "0.5.19"), ("0.5.20", "0.5.19"), ("0.5.21", "0.5.21"), ("0.5.22", "0.5.21"),
    ("0.5.23", "0.5.23")])
def test_each_verified_release_has_its_layout(version, layout):
    info = check_version(version)
    assert (info.layout, info.verified, info.reason, info.warning) == (layout, True, None, None)


def test_the_verified_list_covers_every_layout_in_order():
    layouts = [check_version(v).layout for v in VERIFIED]
    assert sorted(set(layouts), key=layouts.index) == list(LAYOUTS)
    assert [parse_version(v) for v in VERIFIED] == sorted(parse_version(v) for v in VERIFIED)


@pytest.mark.parametrize("version", ["0.5.24", "0.6.0", "1.0.0", "0.5.23.post1",
                                     "0.5.24rc1", "0.0.0.dev0", "0.5.20.dev3+g1234abc"])
def test_an_unverified_release_is_refused_naming_the_newest_verified(version):
    info = check_version(version)
    assert info.layout is None and not info.verified
    assert f"newest verified release: {NEWEST_VERIFIED}" in info.reason or \
        f"newest verified: {NEWEST_VERIFIED}" in info.reason
    allowed = check_version(version, allow_unverified=True)
    assert allowed.layout in LAYOUTS and not allowed.verified
    assert "--allow-unverified-sglang" in allowed.warning


def test_a_release_before_the_deepseek_v4_paths_is_refused_even_opted_in():
    for allow in (False, True):
        info = check_version("0.5.12", allow)
        assert info.layout is None and "0.5.13" in info.reason


@given(st.tuples(st.integers(0, 3), st.integers(0, 30), st.integers(0, 40)))
def test_no_version_outside_the_list_gets_a_layout_without_the_opt_in(parts):
    version = ".".join(map(str, parts))
    info = check_version(version)
    assert (info.layout is not None) == (version in VERIFIED)


def test_the_plugin_refuses_an_unverified_sglang_in_its_receipts(tmp_path, monkeypatch):
    """No hook is installed on a release no one read: every requested patch is refused."""
    writer = ReceiptWriter(tmp_path, ProcessInfo(pid=1, role="server", kind="scheduler",
                                                 tp_rank=0, dp_rank=0, pp_rank=0))
    receipts = install_patches({"mhc-bf16": "bf16"}, check_version("0.5.24"), writer,
                               builtin_patches())
    assert [(r.patch, r.state) for r in receipts] == [("mhc-bf16", "refused")]
    assert NEWEST_VERIFIED in receipts[0].reason


def test_the_opt_in_reaches_the_plugin_through_its_env(monkeypatch):
    """detect_sglang reads the installed distribution's version; pydantic 2.x stands in for an
    SGLang newer than every verified release."""
    monkeypatch.delenv("DSV4BISECT_ALLOW_UNVERIFIED_SGLANG", raising=False)
    refused = detect_sglang("pydantic")
    assert refused.layout is None and NEWEST_VERIFIED in refused.reason
    monkeypatch.setenv("DSV4BISECT_ALLOW_UNVERIFIED_SGLANG", "1")
    allowed = detect_sglang("pydantic")
    assert allowed.layout == LAYOUTS[-1] and not allowed.verified and allowed.warning
