"""Every hook target exists in the real SGLang wheels with the signature the hooks expect.

Read by AST from the downloaded 0.5.13 and 0.5.14 wheels (never imported): the targets each
patch declares for that layout, the contract observer's target, the signature table, and the
call sites whose contracts the hooks rely on.
"""

from __future__ import annotations

import ast

import pytest

from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.plugin.static import SourceTree, call_keywords, result_index
from dsv4bisect.plugin.targets import CALL_CONTRACTS, CONTRACT_TARGET, SIGNATURES
from dsv4bisect.plugin.versions import layout_for


@pytest.fixture(scope="module")
def tree(wheel):
    return SourceTree(wheel)


def layout_of(tree: SourceTree) -> str:
    layout, why = layout_for(tree.version() or "")
    assert layout is not None, why
    return layout


def test_wheel_version_maps_to_its_own_layout(tree):
    assert layout_of(tree) == tree.version()


def test_every_declared_target_exists_with_its_signature(tree):
    layout = layout_of(tree)
    table = SIGNATURES[layout]
    checked = 0
    for patch in builtin_patches().values():
        targets = patch.sglang.hooks.get(layout)
        assert targets, f"{patch.name} declares no hooks for layout {layout}"
        for target in (*targets, CONTRACT_TARGET):
            sig = table[target]  # every declared target has an expected signature
            if sig.external:
                continue
            found = tree.resolve(target)
            assert not isinstance(found, str), f"{patch.name}: {found}"
            assert found.kind in ("method", "function"), target
            assert sig.mismatch(found.param_names) is None, \
                f"{target}: {sig.mismatch(found.param_names)}"
            checked += 1
    assert checked >= 10


def test_signature_table_has_no_stale_entries(tree):
    layout = layout_of(tree)
    declared = {t for p in builtin_patches().values() for t in p.sglang.hooks.get(layout, ())}
    assert set(SIGNATURES[layout]) == declared | {CONTRACT_TARGET}


@pytest.mark.parametrize("key", sorted(CALL_CONTRACTS))
def test_call_contracts_hold(tree, key):
    patch, _, only = key.partition("@")
    if only and layout_of(tree) != only:
        pytest.skip(f"{key} applies to layout {only}")
    for c in CALL_CONTRACTS[key]:
        calls = tree.calls(c.module, c.callee, within=c.within)
        assert calls, f"no call of {c.callee} in {c.module}.{c.within}"
        fn_tree = tree.tree(c.module)
        for call in calls:
            kw = set(call_keywords(call))
            if c.exact:
                assert kw == c.keywords, f"{c.callee}: {sorted(kw ^ c.keywords)} ({c.why})"
            else:
                assert c.keywords <= kw, f"{c.callee} lacks {sorted(c.keywords - kw)} ({c.why})"
            if c.index is not None:
                assert result_index(call, fn_tree) == c.index, c.why


def test_stock_hash_topk_asserts_only_in_0513(tree):
    """Why hash-topk-scaling hooks __init__ on 0.5.13 only: the stock assert."""
    init = tree.resolve("sglang.srt.layers.moe.hash_topk.HashTopK.__init__")
    asserts = [n for n in ast.walk(init.node) if isinstance(n, ast.Assert)
               and "apply_routed_scaling_factor_on_output" in ast.unparse(n.test)]
    assert bool(asserts) == (layout_of(tree) == "0.5.13")


def test_indexer_function_is_looked_up_at_call_time(tree):
    """triton-indexer replaces a module global: forward_c4_indexer must read the global, not
    hold a reference taken at import."""
    calls = tree.source("sglang.srt.layers.attention.dsv4.indexer")
    assert "fn = fp8_paged_mqa_logits_torch_sm120" in calls


def test_decode_entry_is_imported_inside_the_forward(tree):
    """mma-decode replaces a module attribute: the backend imports it at call time."""
    fwd = tree.resolve("sglang.srt.layers.attention.deepseek_v4_backend."
                       "DeepseekV4AttnBackend.forward")
    imports = [n for n in ast.walk(fwd.node) if isinstance(n, ast.ImportFrom)
               and any(a.name == "flash_mla_with_kvcache_sm120" for a in n.names)]
    assert imports and imports[0].module == "sglang.srt.layers.attention.flash_mla_sm120"
