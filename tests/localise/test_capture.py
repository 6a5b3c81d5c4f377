"""The recorder on the embedded engine's random tiny model (localise/capture.py, protocol.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from dsv4bisect.localise import protocol as P
from dsv4bisect.localise.capture import recording
from dsv4bisect.localise.judge import localise, null_comparisons
from dsv4bisect.localise.sites import compare_site
from dsv4bisect.reference.engine import ReferenceEngine


@pytest.fixture(scope="module")
def engine() -> ReferenceEngine:
    return ReferenceEngine.load(None, precision="deployment")


def _transcripts() -> list[P.Transcript]:
    ids = tuple((7 * i + 3) % 500 + 5 for i in range(64))
    return P.with_mates([P.Transcript("t", ids, 56)])


def _capture(engine: ReferenceEngine, arm: P.Arm = P.BASE, chunk: int = 2048):
    ts = _transcripts()
    with recording(engine.model) as rec:
        P.run(engine.model, ts, P.schedule(ts, arm, chunk), rec)
    return rec.capture


def test_the_same_run_twice_is_identical_at_every_site(engine: ReferenceEngine) -> None:
    a, b = _capture(engine), _capture(engine)
    assert list(a.sites) == list(b.sites)
    for key, site in a.sites.items():
        if site.compared:
            c = compare_site(a, b, key)
            assert c is not None and not c.d.any(), key


def test_sites_in_execution_order_with_taps_entries_and_module_inputs(
        engine: ReferenceEngine) -> None:
    cap = _capture(engine)
    order = [s.key for s in cap.ordered()]
    assert order.index("layers.0:mhc.pre_attn:0") < order.index("layers.0.attn:attn.kv_write:0") \
        < order.index("layers.0.attn:attn.sparse_attention:0") \
        < order.index("layers.0.attn:attn.wo_a:0") < order.index("layers.1:mhc.pre_attn:0")
    # the attention's input is attn_norm's output: named, not recorded twice; its output is
    # wo_b's (one tensor, one site)
    assert "layers.0.attn:attention:in0" not in cap.sites
    assert "layers.0.attn:attention:0" not in cap.sites
    assert cap.sites["layers.0.attn.wq_a:linear:0"].inputs == ("layers.0.attn_norm:rmsnorm:0",)
    # the ratio-4 compressor's entries sit at the position that completes them
    pos, rows = cap.site_rows("layers.2.attn.compressor:compressor.entries:0", 0)
    assert list(pos[:3]) == [3, 7, 11] and rows.shape[0] == 64 // 4
    # the batch mate decoded in the same forwards
    assert cap.site_rows("layers.0.attn:attn.kv_write:0", P.MATE + 1) is not None


def test_a_re_chunked_prefill_is_a_harmless_change_and_a_fault_is_not(
        engine: ReferenceEngine) -> None:
    good = _capture(engine)
    null: dict = {}
    for arm in (P.Arm("rechunk@0.5", 0.5), P.Arm("rebatch", rebatch=True)):
        for key, pair in null_comparisons(good, arm.name, _capture(engine, arm)).items():
            null.setdefault(key, []).append(pair)
    assert localise(good, _capture(engine, chunk=20), null).first is None
    engine.switch({"fp8-wo-a-gemm": "scale-layout"})
    try:
        bad = _capture(engine)
    finally:
        engine.switch({})
    first = localise(good, bad, null).first
    assert first is not None and first.site.key == "layers.0.attn:attn.wo_a:0"
    assert first.judged.multiple > 1 and first.inputs_multiple <= 1


def test_alignment_is_proven_on_the_embedding(engine: ReferenceEngine) -> None:
    from dsv4bisect.localise.report import alignment

    good = _capture(engine)
    engine.switch({"mhc-bf16": "bf16"})
    try:
        bad = _capture(engine)
    finally:
        engine.switch({})
    got = alignment(localise(good, bad, {}))
    assert got is not None and got["site"] == "embed:embed:0" and got["bit_identical"]


def test_a_null_arm_that_is_the_change_under_test_is_held_out() -> None:
    from dsv4bisect.localise.embedded import held_out
    from dsv4bisect.localise.settings import EmbeddedSettings

    ts = _transcripts()
    good, bad = EmbeddedSettings("random"), EmbeddedSettings("random", chunk_size=28)
    rechunk = P.Arm("rechunk@0.5", 0.5)  # the 56-token prompt split at 28: bad's forwards
    assert P.schedule(ts, rechunk, 2048)[:2] == P.schedule(ts, P.BASE, 28)[:2]
    assert held_out(ts, [rechunk, P.Arm("rebatch", rebatch=True)], good, bad) == \
        [rechunk, P.Arm("rebatch", rebatch=True)]  # the mate's prefill differs: not the same
    same = EmbeddedSettings("random", patches={"mhc-bf16": "bf16"})
    assert held_out(ts, [P.BASE, rechunk], good, same) == [rechunk]
