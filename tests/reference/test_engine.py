"""ReferenceEngine: loading, info, greedy generation, teacher-forced scoring, request errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from dsv4bisect.errors import ConfigError, EngineError, PatchError
from dsv4bisect.reference.checkpoint import random_model, save_checkpoint, state_tensors
from dsv4bisect.reference.config import ModelArgs
from dsv4bisect.reference.engine import ReferenceEngine, RequestError, top_alternatives

TINY = ModelArgs.preset("tiny")


@pytest.fixture(scope="module")
def engine() -> ReferenceEngine:
    return ReferenceEngine.load(None, device="cpu")


def prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(
        2, TINY.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)
    ).tolist()


def test_info_describes_the_engine(engine: ReferenceEngine) -> None:
    info = engine.info()
    assert info["compress_ratios"] == [0, 0, 4, 16, 4, 16, 0]
    assert info["config"]["index_topk"] == 8 and info["config"]["model_type"] == "deepseek_v4"
    assert info["device"] == "cpu" and info["torch_version"] == torch.__version__
    assert re.fullmatch(r"[0-9a-f]{16}", info["engine_version"])
    assert info["patches"] == {} and info["moe_backend"] == "triton"
    assert info["max_model_len"] == engine.max_model_len == 32768
    assert info["threads"] == 1  # the CPU default (robust when cores are shared)
    assert engine.config == TINY


def test_greedy_generation_is_bit_for_bit_deterministic(engine: ReferenceEngine) -> None:
    other = ReferenceEngine.load(None, device="cpu")
    ids = prompt(150)
    a = engine.generate(ids, max_new_tokens=30, stop_ids=(), top_logprobs=3)
    b = other.generate(ids, max_new_tokens=30, stop_ids=(), top_logprobs=3)
    assert a == b
    assert len(a.output_ids) == 30 and a.finish_reason == "length"
    assert len(set(a.output_ids)) > 3  # not a degenerate repetition


def test_teacher_forced_scores_equal_generation_logprobs() -> None:
    """At `exact`. (At `deployment` a decode step and a prefill take different kernels, as they
    do on SGLang - reference/dispatch.py - so the two differ there by design.)"""
    engine = ReferenceEngine.load(None, device="cpu", precision="exact")
    ids = prompt(120, seed=1)
    gen = engine.generate(ids, max_new_tokens=12, stop_ids=(), top_logprobs=4)
    scores = engine.score(ids + gen.output_ids, start=len(ids), top_logprobs=4)
    assert [s.position for s in scores] == list(range(120, 132))
    assert [s.token_id for s in scores] == gen.output_ids
    for s, lp, top in zip(scores, gen.logprobs, gen.top_logprobs, strict=True):
        assert abs(s.logprob - lp) < 1e-4
        assert [t for t, _ in s.top] == [t for t, _ in top]
        assert s.top[0][0] == s.token_id  # greedy tokens are the argmax


def test_chunk_size_does_not_change_the_answer() -> None:
    """At `exact` chunking changes only fp32 rounding. (At `deployment` a rounding difference
    can flip an FP4/FP8 rounding, and the chaotic random model amplifies that, as a real
    quantised deployment's batch shapes do.)"""
    ids = prompt(200, seed=2)
    small = ReferenceEngine.load(None, device="cpu", chunk_size=23, precision="exact")
    big = ReferenceEngine.load(None, device="cpu", chunk_size=2048, precision="exact")
    a = small.generate(ids, max_new_tokens=8, stop_ids=())
    b = big.generate(ids, max_new_tokens=8, stop_ids=())
    assert a.output_ids == b.output_ids
    assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    for start in (0, 57):
        sa, sb = small.score(ids, start=start), big.score(ids, start=start)
        assert (
            [x.position for x in sa] == [y.position for y in sb] == list(range(max(start, 1), 200))
        )
        assert max(abs(x.logprob - y.logprob) for x, y in zip(sa, sb, strict=True)) < 1e-4


def test_score_start_semantics(engine: ReferenceEngine) -> None:
    ids = prompt(30, seed=3)
    assert [s.position for s in engine.score(ids, start=0)] == list(range(1, 30))
    assert [s.position for s in engine.score(ids, start=25)] == list(range(25, 30))
    assert engine.score(ids, start=30) == [] and engine.score(ids[:1], start=0) == []
    assert all(s.top == [] and s.logprob <= 0 for s in engine.score(ids, start=1))


def test_stop_ids_and_zero_tokens(engine: ReferenceEngine) -> None:
    ids = prompt(60, seed=4)
    free = engine.generate(ids, max_new_tokens=6, stop_ids=())
    stop_at = free.output_ids[2]
    g = engine.generate(ids, max_new_tokens=6, stop_ids=[stop_at])
    first = free.output_ids.index(stop_at)
    assert g.output_ids == free.output_ids[: first + 1] and g.finish_reason == "stop"
    empty = engine.generate(ids, max_new_tokens=0)
    assert empty.output_ids == [] and empty.finish_reason == "length"


def test_top_alternatives_break_ties_to_the_lower_id() -> None:
    logits = torch.tensor([[0.0, 2.0, 5.0, 2.0, 5.0]])
    lp = torch.log_softmax(logits, -1)
    assert [t for t, _ in top_alternatives(logits, lp, 4)[0]] == [2, 4, 1, 3]


@pytest.mark.parametrize(
    ("ids", "kwargs", "match"),
    [
        ([], {}, "empty"),
        ([1, 512], {}, "vocabulary"),
        ([1, True], {}, "vocabulary"),
        ("abc", {}, "list of token ids"),
        ([1, 2], {"top_logprobs": -1}, "top_logprobs"),
        ([1, 2], {"max_new_tokens": -1}, "max_new_tokens"),
        ([1] * 100, {"max_new_tokens": 10}, "max_model_len"),
    ],
)
def test_bad_requests_are_request_errors(ids, kwargs, match: str) -> None:
    engine = ReferenceEngine.load(None, device="cpu", max_model_len=105)
    with pytest.raises(RequestError, match=match):
        engine.generate(ids, **({"max_new_tokens": 1} | kwargs))
    assert issubclass(RequestError, ValueError)


def test_load_errors() -> None:
    with pytest.raises(PatchError, match="unknown patch `mma-decoed`") as err:
        ReferenceEngine.load(None, patches={"mma-decoed": "split-k"})
    assert "mma-decode" in (err.value.hint or "")
    with pytest.raises(PatchError, match="no variant `split-q`"):
        ReferenceEngine.load(None, patches={"mma-decode": "split-q"})
    with pytest.raises(ConfigError, match="MoE runner backend `trtion`"):
        ReferenceEngine.load(None, moe_backend="trtion")
    with pytest.raises(ConfigError, match="device"):
        ReferenceEngine.load(None, device="tpu")
    with pytest.raises(ConfigError, match="chunk_size"):
        ReferenceEngine.load(None, chunk_size=0)
    with pytest.raises(ConfigError, match="does not exist"):
        ReferenceEngine.load("/nonexistent/ckpt")
    if not torch.cuda.is_available():
        with pytest.raises(EngineError, match="CUDA"):
            ReferenceEngine.load(None, device="cuda")


def test_a_checkpoint_directory_serves_the_same_model(
    engine: ReferenceEngine, tmp_path: Path
) -> None:
    save_checkpoint(tmp_path, TINY, state_tensors(random_model(TINY, seed=0)))
    loaded = ReferenceEngine.load(tmp_path, device="cpu", patches={"mma-decode": "split-k"})
    assert loaded.info()["model"] == str(tmp_path.resolve())
    assert loaded.info()["patches"] == {"mma-decode": "split-k"}
    plain = ReferenceEngine.load(tmp_path, device="cpu")
    ids = prompt(40, seed=5)
    assert plain.generate(ids, max_new_tokens=5, stop_ids=()) == engine.generate(
        ids, max_new_tokens=5, stop_ids=()
    )


@pytest.mark.gpu
@pytest.mark.parametrize("patches", [{}, {"mma-decode": "split-k", "triton-indexer": "bf16"}])
def test_cuda_engine_matches_cpu(engine: ReferenceEngine, patches: dict[str, str]) -> None:
    """On CUDA the Triton kernels replace the references; greedy output and log-probs agree."""
    cpu = ReferenceEngine.load(None, device="cpu", patches=patches)
    gpu = ReferenceEngine.load(None, device="cuda", patches=patches)
    assert gpu.info()["device"].startswith("cuda")
    ids = prompt(900, seed=8)  # HCA lists need two splits from position 783
    a = cpu.generate(ids, max_new_tokens=8, stop_ids=())
    b = gpu.generate(ids, max_new_tokens=8, stop_ids=())
    assert a.output_ids[0] == b.output_ids[0]
    assert abs(a.logprobs[0] - b.logprobs[0]) < 2e-2
    sa, sb = cpu.score(ids, start=700), gpu.score(ids, start=700)
    diffs = [abs(x.logprob - y.logprob) for x, y in zip(sa, sb, strict=True)]
    assert sum(diffs) / len(diffs) < 2e-2
