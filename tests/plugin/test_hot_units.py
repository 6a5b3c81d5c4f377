"""The pieces of the SGLang hot switch that need no SGLang: the per-call gate, what a switch
request may change, and what happens to the CUDA graphs (tests/sglang/test_hot_switch.py runs
them all together against the wheels' classes)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.patchspec.plan import HookSpec
from dsv4bisect.plugin.graphs import GraphError, recapture_entry, refresh_graphs
from dsv4bisect.plugin.hot import SwitchState, env_rule, gate, load_time_reason, refusals
from dsv4bisect.plugin.receipts import ProcessInfo

PROC = ProcessInfo(pid=1, role="server", kind="scheduler", tp_rank=0)


class Calls:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def called(self, target: str) -> None:
        self.seen.append(target)

    def log(self, key: str, value: object) -> None:
        pass


def _original(x: int) -> int:
    return x + 1


def test_the_gate_runs_the_live_variant_or_the_original():
    active: dict[str, str] = {}
    rec = Calls()
    hook = gate("p", "m.f", {
        "r": HookSpec("m.f", "replace", lambda x: -x, on_path=True),
        "a": HookSpec("m.f", "around", lambda orig, x: orig(x) * 10),
        "after": HookSpec("m.f", "after", lambda result, x: result * 100),
    }, active, rec)
    assert hook.type == "around" and hook.on_path
    assert hook.fn(_original, 2) == 3  # off: SGLang's original
    for variant, want in (("r", -2), ("a", 30), ("after", 300)):
        active["p"] = variant
        assert hook.fn(_original, 2) == want
    active.clear()
    assert hook.fn(_original, 2) == 3
    assert rec.seen == ["m.f"]  # the path is taken, whichever state is on (first call only)


def _state(active: dict[str, str], version: str = "0.5.23") -> SwitchState:
    return SwitchState(version, PROC, Path("/nonexistent"), dict(active),
                       hot={"mhc-bf16": {"bf16": None}, "mma-decode": {"split-k": None,
                                                                     "merge-no-rescale": "no"}},
                       fixed={"nvfp4-dispatch": "chosen when the layers are built"})


def test_a_request_may_only_change_what_was_installed_hot():
    state = _state({"mhc-bf16": "bf16", "nvfp4-dispatch": "hybrid"})
    assert refusals(state, {"nvfp4-dispatch": "hybrid", "mma-decode": "split-k"}) == []
    why = refusals(state, {"mhc-bf16": "bf16"})
    assert why == ["nvfp4-dispatch (off): decided at load time, needs a fresh launch (chosen "
                   "when the layers are built)"]
    why = refusals(state, {"nvfp4-dispatch": "hybrid", "triton-indexer": "bf16",
                           "mma-decode": "split-k-fp32"})
    assert why[0].startswith("mma-decode:split-k-fp32: variant not installed at launch")
    assert why[1].startswith("triton-indexer:bf16: not installed at launch")
    why = refusals(state, {"nvfp4-dispatch": "hybrid", "mma-decode": "merge-no-rescale"})
    assert why == ["mma-decode:merge-no-rescale: refused at launch: no"]


def test_load_time_and_per_call_switches_follow_the_patch_declarations():
    known = builtin_patches()
    v23, v13 = (0, 5, 23), (0, 5, 13)
    assert load_time_reason(known["fused-mhc-post-pre"], v23)  # read in __init__
    assert load_time_reason(known["sm120-flashmla-backend"], v23) is None  # global re-assigned
    mla = env_rule(known["sm120-flashmla-backend"], v23)
    assert [c.target for c in mla.copies] == [
        "sglang.kernels.ops.attention.flash_mla_sm120._sm120_default_backend"]
    assert [c.module for c in env_rule(known["sm120-flashmla-backend"], (0, 5, 15, 1)).copies] \
        == ["sglang.srt.layers.attention.flash_mla_sm120"]  # before the kernels/ops move
    assert env_rule(known["sm120-flashmla-backend"], (0, 5, 14)) is None  # absent
    assert load_time_reason(known["hash-topk-scaling"], v13)  # HashTopK.__init__ hook
    assert load_time_reason(known["hash-topk-scaling"], v23) is None
    assert load_time_reason(known["mhc-bf16"], v23) is None
    assert env_rule(known["fused-hash-topk"], v23).on == {"SGLANG_OPT_USE_FUSED_HASH_TOPK": "1"}
    assert env_rule(known["fused-mhc-post-pre"], v23) is None  # read once: no live switch
    assert env_rule(known["mhc-bf16"], v23) is None


def _runner(attr: str, graph: bool = True, **extra: object) -> SimpleNamespace:
    r = SimpleNamespace(eager_runner=object(), captures=0, **extra)
    setattr(r, attr, object() if graph else r.eager_runner)
    return r


@pytest.mark.parametrize("version", ["0.5.13", "0.5.16", "0.5.22"])
def test_decode_graphs_are_recaptured_through_the_release_entry(version):
    method, attr = recapture_entry(version)
    runner = _runner(attr)
    setattr(runner, method, lambda: setattr(runner, "captures", runner.captures + 1))
    assert refresh_graphs(runner, version, has_draft=False) == "recaptured"
    assert runner.captures == 1
    assert refresh_graphs(_runner(attr, graph=False), version, has_draft=False) == "eager"


def test_what_the_switch_cannot_recapture_is_refused():
    with pytest.raises(GraphError, match="prefill CUDA graph is captured"):
        refresh_graphs(_runner("decode_cuda_graph_runner", prefill_cuda_graph_runner=object()),
                       "0.5.23", has_draft=False)
    with pytest.raises(GraphError, match="speculative decoding"):
        refresh_graphs(_runner("decode_cuda_graph_runner"), "0.5.23", has_draft=True)
    with pytest.raises(GraphError, match="no known CUDA-graph re-capture entry"):
        refresh_graphs(_runner("graph_runner"), "0.5.12", has_draft=False)


def test_a_busy_scheduler_refuses_and_applies_once_idle(tmp_path):
    import json

    from dsv4bisect.base.switching import write_request
    from dsv4bisect.plugin.hot import flush_hook

    state = _state({"mhc-bf16": "bf16"})
    state.directory = tmp_path
    runner = _runner("decode_cuda_graph_runner")
    runner.recapture_decode_cuda_graph = lambda: setattr(runner, "captures", runner.captures + 1)
    sched = SimpleNamespace(busy=True, draft_worker=None, flushed=0,
                            tp_worker=SimpleNamespace(model_runner=runner))
    sched.is_fully_idle = lambda: not sched.busy

    def original(self, empty_cache=True):  # SGLang's flush_cache: flushes only when idle
        self.flushed += not self.busy
        return not self.busy

    hook = flush_hook(state)
    assert hook(original, sched) is False  # no request: the original, nothing else
    assert not list(tmp_path.glob("receipt-*"))
    write_request(tmp_path, 1, "mma-decode")
    receipt = tmp_path / "receipt-g1-server-tp0.json"
    assert hook(original, sched) is False
    rec = json.loads(receipt.read_text())
    assert (rec["ok"], rec["patches"], rec["graphs"]) == (False, "mhc-bf16", "none")
    assert "not idle" in rec["error"] and state.generation == 0
    sched.busy = False
    assert hook(original, sched) is True
    rec = json.loads(receipt.read_text())
    assert (rec["ok"], rec["patches"], rec["graphs"]) == (True, "mma-decode", "recaptured")
    assert state.active == {"mma-decode": "split-k"} and state.generation == 1
    assert runner.captures == 1 and sched.flushed == 1
    assert hook(original, sched) is True and runner.captures == 1  # applied once
    assert sched.flushed == 2


def test_an_import_time_copy_is_declared_only_on_a_per_call_switch():
    from dsv4bisect.patchspec.spec import ImportCopy, SglangRule

    copy = ImportCopy("m", "_g", "V")
    with pytest.raises(ValueError, match="per-call env switch"):
        SglangRule((0, 5, 15), None, "env", "e", on={"V": "1"}, read_once="at import",
                   copies=(copy,))
    with pytest.raises(ValueError, match="rule's own switch"):
        SglangRule((0, 5, 15), None, "env", "e", on={"W": "1"}, copies=(copy,))


def test_a_copy_that_cannot_be_reassigned_refuses_the_switch():
    """Without the module (or its global) the env would change but the dispatch would not:
    the patch is then marked not switchable instead of half-switched."""
    from dsv4bisect.patchspec.spec import ImportCopy, SglangRule
    from dsv4bisect.plugin.hot import check_copies

    gone = SglangRule((0, 5, 15), None, "env", "e", on={"V": "1"},
                      copies=(ImportCopy("dsv4bisect_no_such_module", "_g", "V"),))
    assert check_copies(gone).startswith("cannot import dsv4bisect_no_such_module")
    renamed = SglangRule((0, 5, 15), None, "env", "e", on={"V": "1"},
                         copies=(ImportCopy("dsv4bisect.plugin.hot", "_no_such_global", "V"),))
    assert "is gone" in check_copies(renamed)
    no_envs = SglangRule((0, 5, 15), None, "env", "e", on={"V": "1"},
                         copies=(ImportCopy("dsv4bisect.plugin.hot", "logger", "V"),))
    assert "has no envs.V.get()" in check_copies(no_envs)
