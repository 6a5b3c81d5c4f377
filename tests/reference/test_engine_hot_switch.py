"""Hot switching on the embedded engine: a switched engine computes exactly what a fresh load of
the new patch set computes (docs/hot-switching.md), and what cannot be switched is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bisect.base.switching import read_request, wait_receipts, write_request
from dsv4bisect.errors import EngineError
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.patching.wire import format_patch_set
from dsv4bisect.reference.engine import ReferenceEngine
from dsv4bisect.reference.generation import Generator
from dsv4bisect.reference.switch import HotSwitch
from dsv4bisect.reference.tokenizer import ByteTokenizer

WEIGHTS = str(Path(__file__).resolve().parents[2] / "dsv4bisect" / "reference" / "weights")
PROMPT = list(range(3, 300, 7)) * 3  # 129 tokens: several compressed blocks and decode steps
HOT = {"mhc-bf16": "bf16", "mma-decode": "split-k", "triton-indexer": "bf16",
       "hash-topk-scaling": "double-scale"}


def _transcript(engine: ReferenceEngine) -> tuple[list[float], list[int]]:
    scores = engine.score(PROMPT, start=1, top_logprobs=4)
    gen = engine.generate(PROMPT, max_new_tokens=12, top_logprobs=4)
    return [s.logprob for s in scores] + list(gen.logprobs), gen.output_ids


@pytest.mark.parametrize("precision", ["deployment", "exact"])
@pytest.mark.parametrize("launched, target", [
    ({}, {"mhc-bf16": "bf16", "mma-decode": "split-k"}),
    ({"mhc-bf16": "bf16", "triton-indexer": "bf16"}, {"hash-topk-scaling": "double-scale"}),
    ({"nvfp4-dispatch": "hybrid"}, {"nvfp4-dispatch": "hybrid", "mma-decode": "split-k"}),
    # a switch puts another implementation in the wo_a_input place: off -> fp8 -> a fault of it
    ({}, {"fp8-wo-a-gemm": "fp8"}),
    ({"fp8-wo-a-gemm": "fp8"}, {"fp8-wo-a-gemm": "scale-layout", "mhc-bf16": "bf16"}),
])
def test_switched_logprobs_equal_a_fresh_launch(launched: dict[str, str],
                                                target: dict[str, str], precision: str) -> None:
    hot = ReferenceEngine.load(WEIGHTS, patches=launched, device="cpu", precision=precision)
    _transcript(hot)  # the engine has served requests before the switch
    hot.switch(target)
    fresh = ReferenceEngine.load(WEIGHTS, patches=target, device="cpu", precision=precision)
    assert _transcript(hot) == _transcript(fresh)  # bit for bit: CPU is deterministic
    assert hot.info()["patches"] == fresh.info()["patches"]


def _server_side(tmp_path: Path, launched: dict[str, str]) -> tuple[HotSwitch, dict]:
    engine = ReferenceEngine.load(None, patches=launched, device="cpu")
    info = dict(engine.info())
    return HotSwitch(engine, Generator(engine, ByteTokenizer(engine.config.vocab_size)), info,
                     tmp_path, HOT, "server"), info


def test_protocol_applies_newer_generations_once_and_writes_receipts(tmp_path: Path) -> None:
    switch, info = _server_side(tmp_path, {})
    known = builtin_patches()
    write_request(tmp_path, 1, format_patch_set({"mhc-bf16": "bf16"}, known))
    switch.apply_pending()
    receipt, = wait_receipts(tmp_path, 1, {("server", 0)}, timeout_s=1)
    assert receipt["ok"] and info["patches"] == {"mhc-bf16": "bf16"}
    assert info["switch_generation"] == 1
    switch.apply_pending()  # the same generation again: nothing happens
    assert read_request(tmp_path).generation == 1
    write_request(tmp_path, 2, format_patch_set({}, known))  # switched back off
    switch.apply_pending()
    assert wait_receipts(tmp_path, 2, {("server", 0)}, timeout_s=1)[0]["ok"]
    assert info["patches"] == {}


def test_load_time_and_unannounced_patches_are_refused(tmp_path: Path) -> None:
    switch, info = _server_side(tmp_path, {})
    known = builtin_patches()
    write_request(tmp_path, 1, format_patch_set({"nvfp4-dispatch": "hybrid"}, known))
    switch.apply_pending()
    with pytest.raises(EngineError, match="nvfp4-dispatch cannot change in a running engine"):
        wait_receipts(tmp_path, 1, {("server", 0)}, timeout_s=1)
    write_request(tmp_path, 2, format_patch_set({"mma-decode": "merge-no-rescale"}, known))
    switch.apply_pending()
    with pytest.raises(EngineError, match="was not among the hot patches"):
        wait_receipts(tmp_path, 2, {("server", 0)}, timeout_s=1)
    assert info["patches"] == {}  # a refused switch changes nothing


def test_a_missing_receipt_is_an_error_naming_the_process(tmp_path: Path) -> None:
    write_request(tmp_path, 1, "")
    with pytest.raises(EngineError, match="no receipt from decode tp1"):
        wait_receipts(tmp_path, 1, {("decode", 1)}, timeout_s=0.2)


def test_a_served_engine_switches_at_flush_cache_and_scores_as_a_fresh_one(
        tmp_path: Path) -> None:
    """The protocol through a real `dsv4bisect serve` process: request, /flush_cache, receipt,
    /server_info, and the switched engine's logprobs equal a fresh engine's."""
    import requests

    from dsv4bisect import env as envvars
    from tests.reference.test_server import free_port, start_server, stop, wait_healthy

    known = builtin_patches()
    env = {envvars.SWITCH_DIR: str(tmp_path), envvars.HOT: format_patch_set(HOT, known)}
    port = free_port()
    proc = start_server(port, env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base)
        write_request(tmp_path, 1, format_patch_set({"mma-decode": "split-k"}, known))
        assert requests.post(f"{base}/flush_cache", timeout=60).status_code == 200
        assert wait_receipts(tmp_path, 1, {("server", 0)}, timeout_s=30)[0]["ok"]
        info = requests.get(f"{base}/server_info", timeout=30).json()
        assert info["patches"] == {"mma-decode": "split-k"} and info["switch_generation"] == 1
        body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 0},
                "return_logprob": True, "logprob_start_len": 0}
        served = requests.post(f"{base}/generate", json=body, timeout=120).json()
    finally:
        stop(proc)
    fresh = ReferenceEngine.load(None, patches={"mma-decode": "split-k"}, device="cpu")
    want = [s.logprob for s in fresh.score(PROMPT, start=1)]
    got = [lp for lp, _id, _ in served["meta_info"]["input_token_logprobs"][1:]]
    assert got == want  # bit for bit
