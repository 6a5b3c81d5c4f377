"""The taps of the embedded model: each one-line `tap(...)` site names an op of the op table, the
table names no op without a site, and a tap costs nothing while nothing records."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dsv4bisect.reference.model as model_module
from dsv4bisect.localise import ops
from dsv4bisect.reference import taps


def _tap_sites() -> dict[str, str]:
    """op -> the function whose body taps it, from reference/model.py's source."""
    tree = ast.parse(Path(model_module.__file__).read_text())
    out: dict[str, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "tap":
                    out[node.args[1].value] = fn.name
    return out


def test_every_tap_is_in_the_op_table_and_every_tapped_op_has_a_site() -> None:
    sites = _tap_sites()
    assert set(sites) <= set(ops.BY_NAME), set(sites) - set(ops.BY_NAME)
    assert {o.name for o in ops.TAPS} == set(sites)


def test_the_ops_the_faults_change_are_named_in_the_table() -> None:
    acts = {a for o in ops.BY_NAME.values() for a in o.acts_on}
    for fault in ("fp8-wo-a-gemm:scale-layout", "fp8-wo-a-gemm:scale-truncate",
                  "mma-decode:merge-no-rescale", "mma-decode:compress-rope-base",
                  "mma-decode:batch-kv-slot", "mma-decode:swa-ring-stale",
                  "nextn-speculation:draft-eos"):
        assert fault in acts, fault


def test_a_tap_returns_at_once_without_a_recorder_and_recorders_do_not_nest() -> None:
    assert not taps.active()
    assert taps.tap(object(), "attn.q", 1) is None

    class Rec:
        def record(self, *a: object) -> None:
            raise AssertionError("not called")

    with taps.recording(Rec()):
        assert taps.active()
        with pytest.raises(RuntimeError), taps.recording(Rec()):
            pass
    assert not taps.active()


def test_every_swappable_place_is_recorded_by_an_op_of_the_table() -> None:
    """A patch's code runs at a swappable place (`patchspec.swaps.Op`); the op that records
    the place's output must exist, and for a place in the model's forward, sit in the same
    function as the place's call (a place added without a tap fails here)."""
    from dsv4bisect.patchspec.swaps import Op

    assert set(ops.PLACES) == {o.value for o in Op}
    for names in ops.PLACES.values():
        assert set(names) <= set(ops.BY_NAME), names
    sites = _tap_sites()
    tree = ast.parse(Path(model_module.__file__).read_text())
    calls: dict[str, set[str]] = {}  # function -> the places it calls (self.<place>(...))
    places = {"hc_attn_mixes": "mhc_mixes", "hc_ffn_mixes": "mhc_mixes", "core": "attention",
              "kv_write": "kv_write", "kv_read": "kv_read", "logits": "indexer_logits",
              "selection": "indexer_topk", "wo_a_input": "wo_a_input",
              "head_input": "head_input"}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            for node in ast.walk(fn):
                attr = getattr(node, "attr", None)
                if (isinstance(node, ast.Attribute) and attr in places
                        and isinstance(node.ctx, ast.Load) and "install" not in fn.name
                        and getattr(node.value, "id", None) == "self"):  # its own place
                    calls.setdefault(fn.name, set()).add(places[attr])
    for fn, called in calls.items():
        for place in called:
            if place == "indexer_logits":  # called per sequence; `indexer.scores` records
                continue  # the group's scores where the group's top-k reads them
            tapped = {o for o in ops.PLACES[place] if o in sites}
            assert any(sites[o] == fn for o in tapped), (fn, place, tapped)
