"""State, speculation and the op-level repro on the embedded engine's own code paths: the state a
prefix-cache hit restores against the cold prefill (localise/state.py), speculative rounds
against greedy decoding (speculation.py), and the split-K kernel taken apart (repro.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dsv4bisect.localise import protocol as P
from dsv4bisect.localise.judge import localise
from dsv4bisect.localise.repro import kernel, kernel_parts
from dsv4bisect.localise.state import hit_state, state_capture
from dsv4bisect.reference.engine import ReferenceEngine
from dsv4bisect.reference.scheduler import Scheduler


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
    from dsv4bisect.config.checkpoints import checkpoint_dir
    from dsv4bisect.localise.cases import prompt_ids, tier_cases
    from dsv4bisect.localise.speculation import first_wrong_round
    from dsv4bisect.probe.spec import tier_spec
    from dsv4bisect.reference.spec_settings import SpecSettings

    engine = ReferenceEngine.load(checkpoint_dir("embedded"), precision="deployment",
                                  mtp=True, patches={"nextn-speculation": "draft-eos"})
    a = engine.config
    case = next(c for c in tier_cases(tier_spec("smoke"), a.compress_ratios[:a.num_hidden_layers],
                                      a.sliding_window)
                if c.case_id == "needle/L1024/d0.1/t3/0")
    prompts = [(case.case_id, prompt_ids(case), case.max_tokens)]
    stop = frozenset({a.eos_token_id})
    found, tried = first_wrong_round(engine, prompts, chunk=2048, spec=SpecSettings(),
                                     stop_ids=stop)
    assert tried == 1 and found is not None and found.op == "spec.stop_check"
    assert found.chosen[-1] in stop and found.chosen != found.greedy
    engine.switch({"nextn-speculation": "nextn"})
    none, _ = first_wrong_round(engine, prompts, chunk=2048, spec=SpecSettings(),
                                stop_ids=stop)
    assert none is None  # the default rule emits what greedy decoding emits


def _kernel_inputs(T: int = 6, H: int = 4, D: int = 64, N: int = 200):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(T, H, D, generator=g)
    kv = torch.randn(N, D, generator=g)
    idx = torch.stack([torch.randperm(N, generator=g)[:150] for _ in range(T)])  # 3 splits
    return {"q": q, "kv": kv, "indices": idx, "sink": torch.zeros(H), "scale": D ** -0.5}


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
    assert kernel(inputs, lse).shape == inputs["q"].shape


@pytest.mark.parametrize(("module", "op", "patches"), [
    ("layers.0", "mhc.pre_attn", {"mhc-bf16": "bf16"}),
    ("layers.1", "mhc.pre_ffn", {"mhc-bf16": "bf16"}),
    ("layers.0.attn", "attn.wo_a", {"fp8-wo-a-gemm": "scale-layout"}),
    ("layers.3.attn", "attn.sparse_attention", {"mma-decode": "split-k"}),
])
def test_the_op_level_repro_rebuilds_the_op_from_a_save_pass(module: str, op: str,
                                                            patches: dict[str, str]) -> None:
    from dsv4bisect.localise.capture import recording
    from dsv4bisect.localise.repro import build, op_settings, run_op
    from dsv4bisect.reference.config import Numerics

    engine = ReferenceEngine.load(None, precision="deployment")
    ids = tuple((3 * i + 2) % 500 + 5 for i in range(40))
    ts = P.with_mates([P.Transcript("t", ids, 40)])
    with recording(engine.model, keep=lambda key: key.startswith(module + ":")) as rec:
        P.run(engine.model, ts, P.schedule(ts, P.BASE, 2048), rec)
    inputs = build(op, module, rec.raw, rec.layouts[0], 0, 0, engine.model)
    assert inputs is not None, sorted(rec.raw)
    layer = int(module.split(".")[1])
    ends = (("good", {}), ("bad", patches))
    settings = {end: op_settings(op, Numerics.from_patches(p, precision="deployment"),
                                 engine.model, layer) for end, p in ends}
    good = run_op(op, inputs, settings["good"])
    bad = run_op(op, inputs, settings["bad"])
    assert good.shape == bad.shape and good.shape[0] == 40
    assert not torch.equal(good, bad)
    # the good end's settings on its own inputs give back what its forward computed
    produced = next(t for f, _, t in rec.raw[f"{module}:{op}:0"].parts if f == 0)
    if op.startswith("mhc"):
        assert torch.allclose(good[:, :produced.shape[1]], produced[:40], atol=1e-6)
    else:
        assert torch.allclose(good, produced[:40].reshape(good.shape), atol=1e-6)
