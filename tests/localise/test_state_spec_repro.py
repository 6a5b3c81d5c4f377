"""State, speculation and the op-level repro on the embedded engine's own code paths: the state a
prefix-cache hit restores against the cold prefill (localise/state.py), speculative rounds
against greedy decoding (speculation.py), and the split-K kernel taken apart (repro.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dsv4bisect.localise import protocol as P  # noqa: E402
from dsv4bisect.localise.judge import localise  # noqa: E402
from dsv4bisect.localise.repro import kernel_parts, run_op  # noqa: E402
from dsv4bisect.localise.state import hit_state, state_capture  # noqa: E402
from dsv4bisect.reference.engine import ReferenceEngine  # noqa: E402
from dsv4bisect.reference.scheduler import Scheduler  # noqa: E402


def _cold_and_hit(engine: ReferenceEngine, ids: tuple[int, ...], prompt: int):
    ts = [P.Transcript("t", ids, prompt)]
    cold = P.run(engine.model, ts, P.schedule(ts, P.BASE, 2048))[0]
    hit = hit_state(Scheduler, engine, ids, prompt, cold, chunk=2048)
    return state_capture({0: cold}, engine.model), state_capture({0: hit}, engine.model)


def test_a_stale_window_restored_on_a_hit_is_named_and_a_right_one_is_not() -> None:
    engine = ReferenceEngine.load(None, precision="deployment", patches={"mma-decode": "split-k"})
    ids = tuple((5 * i + 1) % 500 + 5 for i in range(72))
    cold, hit = _cold_and_hit(engine, ids, 70)
    assert localise(cold, hit, {}).first is None  # the snapshot is the cold state
    engine.switch({"mma-decode": "swa-ring-stale"})
    cold, hit = _cold_and_hit(engine, ids, 70)
    first = localise(cold, hit, {}).first
    assert first is not None and first.site.key == "layers.0.attn:state.swa_window:0"
    # the restored window rows still held after the hit's one token (the window slid by one)
    window = engine.config.sliding_window
    assert first.judged.outside[0] == (0, 71 - (window - 1))


def test_a_drafted_stop_taken_unverified_is_the_stop_check() -> None:
    from dsv4bisect.localise.cases import prompt_ids, tier_cases
    from dsv4bisect.localise.speculation import first_wrong_round
    from dsv4bisect.probe.spec import tier_spec
    from dsv4bisect.reference.spec_settings import SpecSettings

    from dsv4bisect.config.checkpoints import checkpoint_dir

    engine = ReferenceEngine.load(checkpoint_dir("embedded"), precision="deployment",
                                  mtp=True, patches={"nextn-speculation": "draft-eos"})
    a = engine.config
    case = next(c for c in tier_cases(tier_spec("smoke"), a.compress_ratios[:a.num_hidden_layers],
                                      a.sliding_window)
                if c.case_id == "needle/L1024/d0.1/t3/0")
    prompts = [(case.case_id, prompt_ids(case), case.max_tokens)]
    stop = frozenset({a.eos_token_id})
    found, tried = first_wrong_round(engine, prompts, chunk=2048, spec=SpecSettings(),
                                     spec_fault="draft-eos", stop_ids=stop)
    assert tried == 1 and found is not None and found.op == "spec.stop_check"
    assert found.chosen[-1] in stop and found.chosen != found.greedy
    none, _ = first_wrong_round(engine, prompts, chunk=2048, spec=SpecSettings(),
                                spec_fault=None, stop_ids=stop)
    assert none is None  # the default rule emits what greedy decoding emits


def _kernel_inputs(T: int = 6, H: int = 4, D: int = 64, N: int = 200):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(T, H, D, generator=g)
    kv = torch.randn(N, D, generator=g)
    idx = torch.stack([torch.randperm(N, generator=g)[:150] for _ in range(T)])  # 3 splits
    return {"q": q, "kv": kv, "indices": idx, "sink": torch.zeros(H), "scale": D ** -0.5,
            "segments": None}


def test_the_split_k_kernel_is_taken_apart_into_its_merge_and_its_partials() -> None:
    inputs = _kernel_inputs()
    lse = {"split": 64, "partial": "bfloat16", "merge": "lse", "segmented": False}
    no_rescale = {**lse, "merge": "no-rescale"}
    part, figures = kernel_parts(inputs, lse, no_rescale)
    assert part == "attn.sparse_attention.merge" and figures["kernel"] > 0.01
    fp32 = {**lse, "partial": "float32"}
    part, _ = kernel_parts(inputs, fp32, lse)
    assert part == "attn.sparse_attention.partials"
    off = {"split": None, "partial": "float32", "merge": "lse", "segmented": False}
    assert kernel_parts(inputs, off, lse)[0] == "attn.sparse_attention"  # not split alike
    assert run_op("attn.sparse_attention", inputs, lse).shape == inputs["q"].shape
