"""The vLLM plugin's targets resolve on every verified release, over the shipped source facts
(extracted from each release's wheel; tests/vllm/test_wheels.py regenerates them, slow), and a
release outside the verified list is refused with a hint."""

from __future__ import annotations

import dataclasses
import re

import pytest

from dsv4bisect.base import vllm_releases as vr
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.patchspec.spec import NO_VLLM
from dsv4bisect.plugin.vllm import declared
from dsv4bisect.vllm_hooks import targets as tg

RELEASES = vr.VERIFIED
# A by-value importer on DeepSeek-V4's NVIDIA path (not ROCm, XPU, CPU, V4.1 or another model):
# one the hook must rebind, or the rebinding would miss a call site.
V4_NVIDIA = re.compile(r"^vllm\.(models\.deepseek_v4\.(nvidia|common)\."
                       r"|models\.deepseek_v4\.[a-z_]+$"
                       r"|model_executor\.(models|layers)\.deepseek_v4)")


def test_every_verified_release_ships_its_facts() -> None:
    assert vr.shipped_facts() == list(RELEASES)
    for release in RELEASES:
        facts = vr.load_facts(release)
        assert facts["release"] == release and facts["layout"] == release


@pytest.mark.parametrize("release", RELEASES)
def test_every_hook_target_resolves_with_its_signature(release: str) -> None:
    facts = vr.load_facts(release)
    layout = vr.check_version(release).layout
    assert layout == release
    checked = 0
    for target, sig in tg.SIGNATURES[layout].items():
        fact = facts["symbols"][tg.DEFINED_AT.get(target, target)]
        assert fact is not None, f"{release}: {target} is not defined"
        assert fact["kind"] in ("function", "method"), (target, fact)
        assert sig.mismatch(tuple(fact["params"])) is None, (release, target, fact["params"])
        checked += 1
    every_target = {t for p in builtin_patches() for t in declared.targets(p, layout)}
    assert every_target <= set(tg.SIGNATURES[layout])  # nothing unchecked
    assert checked >= 8


@pytest.mark.parametrize("release", RELEASES)
def test_by_value_copies_are_exactly_the_ones_rebound(release: str) -> None:
    """Each declared copy imports the target by value in that release, and no module on V4's
    NVIDIA path holds a copy the hook would not rebind."""
    facts = vr.load_facts(release)
    for patch in builtin_patches():
        for site in declared.sites(patch, release):
            if not site.copies:
                continue
            importers = facts["by_value"][site.target]
            assert set(site.copies) <= set(importers), (release, site.target, importers)
            on_path = {m for m in importers if V4_NVIDIA.match(m)}
            assert on_path <= set(site.copies), (release, site.target, on_path)


def test_the_mhc_sites_follow_the_release() -> None:
    names = {r: [s.name for s in tg.mhc_sites(r)] for r in RELEASES}
    assert names["0.20.0"] == ["hc_pre"]
    assert names["0.22.0"] == ["hc_pre", "forward_cuda"]
    assert "mhc_pre_broadcast_tilelang" not in names["0.24.0"]
    assert "mhc_pre_broadcast_tilelang" in names["0.28.0"]
    assert names["0.34.0"][-1] == "mhc_fused_post_pre_tilelang_reuse_residual"
    # where the kernels are called by name, the model module is where the copies are rebound
    assert all(s.copies == (tg.V4,) for s in tg.mhc_sites("0.34.0"))


@pytest.mark.parametrize("release", RELEASES)
def test_the_call_sites_the_hooks_rely_on(release: str) -> None:
    facts = vr.load_facts(release)
    for patch, contracts in declared.call_contracts(release).items():
        found = facts["calls"][release][patch]
        for contract, rows in zip(contracts, found, strict=True):
            assert rows["calls"], (release, contract.callee)
            for call in rows["calls"]:
                assert contract.keywords <= set(call["keywords"]), (release, call)
                if contract.keywords_only:
                    assert call["positional"] == 0
                # vLLM hands FlashMLA an output buffer: the hook must fill it
                if contract.callee == "flash_mla_with_kvcache":
                    assert "out" in call["keywords"]


def test_the_worker_entry_and_evidence_points_exist_everywhere() -> None:
    for release in RELEASES:
        symbols = vr.load_facts(release)["symbols"]
        for target in (tg.WORKER, tg.WORKER_STEP, tg.WORKER_WARMUP, tg.PLUGINS):
            assert symbols[target] is not None, (release, target)


@pytest.mark.parametrize("version,why,hint", [
    ("0.19.1", "predates DeepSeek-V4", "upgrade vLLM"),
    ("0.21.0", "not a verified release", "allow_unverified_vllm"),
    ("0.35.0", "not a verified release", "allow_unverified_vllm"),
    ("0.0.0.dev0", "proves nothing", "allow_unverified_vllm"),
    ("garbage", "proves nothing", "allow_unverified_vllm"),
])
def test_an_unverified_or_older_release_is_refused_with_a_hint(version: str, why: str,
                                                               hint: str) -> None:
    info = vr.check_version(version)
    assert info.layout is None and why in (info.reason or "")
    assert hint in vr.refusal_hint(info)


def test_the_opt_in_warns_and_takes_the_range_layout() -> None:
    info = vr.check_version("0.35.0", allow_unverified=True)
    assert info.layout == "0.34.0" and "unverified" not in (info.reason or "")
    assert "0.35.0 is not a verified release" in (info.warning or "")
    assert vr.check_version("0.23.1", allow_unverified=True).layout == "0.22.0"
    assert vr.check_version("0.19.0", allow_unverified=True).layout is None


def test_every_builtin_patch_declares_its_vllm_delivery() -> None:
    """Each built-in patch says in its own file how it reaches vLLM (`PATCH.vllm`), even when
    the answer is `absent`: a hook delivery with its planner and its sites on some layout,
    server arguments with the arguments."""
    for name, patch in builtin_patches().items():
        if patch.test_only:
            continue
        row = patch.vllm
        assert row is not NO_VLLM and row.evidence, name
        assert (patch.planners.vllm is not None) == (row.how == "hook"), name
        assert any(row.sites.values()) == (row.how == "hook"), name
        assert bool(row.args) == (row.how == "args"), name
    with pytest.raises(ValueError, match="goes with a `hook` delivery"):
        dataclasses.replace(builtin_patches()["mhc-bf16"], vllm=NO_VLLM)
