"""The patch registry and the DSV4BISECT_PATCHES wire format."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsv4bisect.errors import ExitCode, PatchError
from dsv4bisect.patches import PATCH_MODULES
from dsv4bisect.patching.registry import builtin_patches, get_patch
from dsv4bisect.patching.wire import format_patch_set, parse_patch_set

KNOWN = builtin_patches()


def test_registry_order_and_names() -> None:
    assert list(KNOWN) == ["mhc-bf16", "hash-topk-scaling", "mma-decode", "triton-indexer",
                           "nvfp4-dispatch", "trtllm-clamp",  # the seed's six
                           "fused-mhc-post-pre", "flashinfer-mhc", "tilelang-indexer",
                           "sm120-flashmla-backend", "fused-hash-topk", "fp8-wo-a-gemm",
                           "nextn-speculation"]
    for module in PATCH_MODULES:
        mod = importlib.import_module(f"dsv4bisect.patches.{module}")
        doc = mod.__doc__ or ""
        sections = ("Speeds up", "Numerical risk", "How to verify")
        if mod.PATCH.sglang.hooks:  # our hooks name the SGLang site they replace
            sections += ("Upstream site",)
        for section in sections:
            assert section in doc, (module, section)
        assert mod.PATCH.doc == doc


def test_fault_variants_are_marked() -> None:
    faults = {(p.name, v.name) for p in KNOWN.values() for v in p.variants if v.fault}
    assert faults == {("hash-topk-scaling", "double-scale"), ("mma-decode", "merge-no-rescale"),
                      ("trtllm-clamp", "ignore-alpha"), ("triton-indexer", "residue"),
                      ("mma-decode", "batch-kv-slot"), ("mma-decode", "decode-rope-fp8"),
                      ("mma-decode", "compress-rope-base"), ("mma-decode", "swa-ring-stale"),
                      ("nextn-speculation", "greedy-verify"), ("nextn-speculation", "draft-eos"),
                      ("fp8-wo-a-gemm", "scale-layout"), ("fp8-wo-a-gemm", "scale-truncate")}
    assert all(not p.variants[0].fault for p in KNOWN.values())
    # a citation and how the bug showed go together, and only on a fault
    for p in KNOWN.values():
        for v in p.variants:
            assert bool(v.citation) == bool(v.showed) and (v.fault or not v.citation), v.name


selections = st.dictionaries(
    st.sampled_from(list(KNOWN)), st.just(None), max_size=6
).flatmap(lambda d: st.fixed_dictionaries(
    {name: st.sampled_from([v.name for v in KNOWN[name].variants]) for name in d}))


@given(selections)
def test_wire_round_trip_in_registry_order(selected: dict[str, str]) -> None:
    text = format_patch_set(selected, KNOWN)
    parsed = parse_patch_set(text, KNOWN)
    assert parsed == selected
    assert list(parsed) == [n for n in KNOWN if n in selected]
    for part in filter(None, text.split(",")):
        name, _, variant = part.partition(":")
        assert (variant == "") == (selected[name] == KNOWN[name].default_variant)


@pytest.mark.parametrize("text,needle", [
    ("mhc-bf61", "unknown patch `mhc-bf61`"),
    ("mma-decode:split-q", "no variant `split-q`"),
    ("mhc-bf16,mhc-bf16", "listed twice"),
])
def test_wire_rejects_bad_input_with_exit_5(text: str, needle: str) -> None:
    with pytest.raises(PatchError, match=needle) as info:
        parse_patch_set(text, KNOWN)
    assert info.value.exit_code == ExitCode.BAD_INPUT
    assert info.value.hint


def test_unknown_patch_has_did_you_mean() -> None:
    with pytest.raises(PatchError) as info:
        get_patch("tritton-indexer")
    assert "triton-indexer" in (info.value.hint or "")
