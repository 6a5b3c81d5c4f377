"""Every hook target exists in every verified SGLang release with the signature the hooks expect.

Read by AST from each release's downloaded wheel (never imported): the targets each patch
declares for that release's layout, the symbols the hook bodies call, the contract observer's
target, the signature table, the call sites whose contracts the hooks rely on, and the
upstream-switch rules of the patches against the flags that release's server args set on SM120.
"""

from __future__ import annotations

import ast

import pytest

from dsv4bisect.base.versions import LAYOUTS, check_version, parse_version
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.plugin.static import SourceTree, call_keywords, result_index, sm120_forced_flags
from dsv4bisect.sglang_hooks.targets import CONTRACT_TARGET, SIGNATURES, hc_pre_target, mla_module


@pytest.fixture(scope="module")
def tree(wheel):
    return SourceTree(wheel)


def layout_of(tree: SourceTree) -> str:
    info = check_version(tree.version() or "")
    assert info.verified and info.layout is not None, info.reason
    return info.layout


def test_wheel_is_a_verified_release_with_a_layout(tree, wheel):
    assert tree.version() in wheel.name and layout_of(tree) in LAYOUTS


def test_every_declared_target_and_call_exists_with_its_signature(tree):
    layout = layout_of(tree)
    table = SIGNATURES[layout]
    checked = 0
    for patch in builtin_patches().values():
        targets = patch.sglang.hooks.get(layout, ())
        assert targets or not any(patch.sglang.hooks.values()), \
            f"{patch.name} declares no hooks for layout {layout}"
        for target in (*targets, *patch.sglang.uses.get(layout, ()), CONTRACT_TARGET):
            sig = table[target]  # every declared target has an expected signature
            if sig.external:
                continue
            found = tree.resolve(target)
            assert not isinstance(found, str), f"{patch.name}: {found}"
            assert found.kind in ("method", "function"), target
            assert sig.mismatch(found.param_names) is None, \
                f"{target}: {sig.mismatch(found.param_names)}"
            checked += 1
    assert checked >= 12


def test_signature_table_has_no_stale_entries(tree):
    layout = layout_of(tree)
    declared = {t for p in builtin_patches().values() for t in p.sglang.hooks.get(layout, ())}
    called = {t for p in builtin_patches().values() for t in p.sglang.uses.get(layout, ())}
    assert set(SIGNATURES[layout]) == declared | called | {CONTRACT_TARGET}


def test_call_contracts_hold(tree):
    layout = layout_of(tree)
    for patch in builtin_patches().values():
        for c in patch.sglang.calls.get(layout, ()):
            calls = tree.calls(c.module, c.callee, within=c.within)
            assert calls, f"{patch.name}: no call of {c.callee} in {c.module}.{c.within}"
            fn_tree = tree.tree(c.module)
            for call in calls:
                kw = set(call_keywords(call))
                if c.exact:
                    assert kw == c.keywords, f"{c.callee}: {sorted(kw ^ c.keywords)} ({c.why})"
                else:
                    assert c.keywords <= kw, f"{c.callee} lacks {sorted(c.keywords - kw)}"
                if c.index is not None:
                    assert result_index(call, fn_tree) == c.index, c.why


def test_stock_hash_topk_asserts_only_in_0513(tree):
    """Why hash-topk-scaling hooks __init__ on 0.5.13 only: the stock assert."""
    init = tree.resolve("sglang.srt.layers.moe.hash_topk.HashTopK.__init__")
    asserts = [n for n in ast.walk(init.node) if isinstance(n, ast.Assert)
               and "apply_routed_scaling_factor_on_output" in ast.unparse(n.test)]
    assert bool(asserts) == (layout_of(tree) == "0.5.13")


def test_indexer_function_is_looked_up_at_call_time(tree):
    """triton-indexer replaces a module global: the indexer must read the global at call time,
    not hold a reference taken at import."""
    src = tree.source("sglang.srt.layers.attention.dsv4.indexer") or ""
    assert "fn = fp8_paged_mqa_logits_torch_sm120" in src


def test_decode_entry_is_imported_where_it_is_called(tree):
    """mma-decode replaces a module attribute: the backend imports it at call time, from the
    module the layout hooks."""
    layout = layout_of(tree)
    contract = builtin_patches()["mma-decode"].sglang.calls[layout][0]
    fwd = tree.resolve(f"{contract.module}.{contract.within}")
    imports = [n for n in ast.walk(fwd.node) if isinstance(n, ast.ImportFrom)
               and any(a.name == "flash_mla_with_kvcache_sm120" for a in n.names)]
    assert imports and imports[0].module == mla_module(layout)


def test_hc_pre_is_not_overridden_by_the_decoder_layer_subclasses(tree):
    """0.5.23 hooks hc_pre on DeepseekV4DecoderLayerBase: no subclass may define its own."""
    v4 = tree.tree("sglang.srt.models.deepseek_v4")
    owner = hc_pre_target(layout_of(tree)).split(".")[-2]
    subclasses = [n for n in v4.body if isinstance(n, ast.ClassDef)
                  and any(getattr(b, "id", "") == owner for b in n.bases)]
    for cls in subclasses:
        assert not any(getattr(n, "name", "") == "hc_pre" for n in cls.body), cls.name


def _rules_for(version: str):
    parsed = parse_version(version)
    for p in builtin_patches().values():
        rule = p.sglang.rule(parsed, "sm120")
        if rule is not None:
            yield p, rule


def test_switch_rules_agree_with_the_flags_the_release_sets_on_sm120(tree):
    """A switch declared `upstream` on SM120 is one this release forces; one declared `env`
    is one it leaves to the user (unset, or only a default when unset)."""
    flags = {f.name: f for f in sm120_forced_flags(tree)}
    assert "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH" in flags
    env_defaults = tree.source("sglang.srt.environ") or ""
    for patch, rule in _rules_for(tree.version() or ""):
        for var in rule.variables:
            forced = var in flags and flags[var].forced
            if rule.how == "env":
                assert not forced, f"{patch.name}: {var} is forced at {flags[var].where}"
                assert f"{var} = Env" in env_defaults, f"{patch.name}: {var} not in environ.py"
            if rule.how == "upstream":
                assert forced, f"{patch.name}: {var} is not forced on SM120 here"
        if rule.how == "absent" and patch.name in ("flashinfer-mhc", "sm120-flashmla-backend"):
            switch = next(v for r in patch.sglang.rules for v in r.variables)
            assert f"{switch} = Env" not in env_defaults, f"{patch.name}: {switch} exists here"


def test_every_switch_is_read_by_the_release_that_declares_it(tree):
    """An `env` rule's variable is read somewhere in the DeepSeek-V4 paths of that release."""
    for patch, rule in _rules_for(tree.version() or ""):
        if rule.how != "env":
            continue
        for var in rule.variables:
            assert any(f"envs.{var}.get()" in (tree.source(m) or "") for m in (
                "sglang.srt.models.deepseek_v4", "sglang.srt.layers.attention.dsv4.indexer",
                "sglang.srt.layers.moe.hash_topk", "sglang.srt.layers.attention.flash_mla_sm120",
                "sglang.kernels.ops.attention.flash_mla_sm120",
                "sglang.srt.models.deepseek_common.amd.deepseek_v4_fused_mhc")), \
                f"{patch.name}: nothing reads {var}"
