"""Training the embedded checkpoint: data, the batched forward, the differentiable ops, a step."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch

from dsv4bisect.kernels.sparse_attention import sparse_attention_ref
from dsv4bisect.probe import formats as fmt
from dsv4bisect.probe.vocab import PROBE_VOCAB, overlap
from dsv4bisect.reference.checkpoint import random_model
from dsv4bisect.reference.model import TrainHooks
from dsv4bisect.reference.tokenizer import ByteTokenizer
from dsv4bisect.reference.training import data
from dsv4bisect.reference.training.ops import train_attention, training_ops
from dsv4bisect.reference.training.train import TrainConfig, train_step
from dsv4bisect.reference.training.vocab import TRAIN_VOCAB

TOK = ByteTokenizer()
RECIPES = Path(__file__).parents[1] / "benchmarks" / "train_recipes"


def test_training_vocabulary_is_disjoint_from_the_probe() -> None:
    assert overlap(PROBE_VOCAB, TRAIN_VOCAB) == []


def test_samples_are_seeded_and_weighted_on_answers() -> None:
    a = data.sample(random.Random(7), 1500)
    b = data.sample(random.Random(7), 1500)
    assert a == b and a.questions >= 1
    assert 1200 <= len(a.ids) <= 1600
    answers = [i for i, w in enumerate(a.weights) if w == data.ANSWER]
    text = TOK.decode([a.ids[i] for i in answers])
    # every supervised answer is a training value (even parity) or a list of them, plus eos
    for value in text.replace("<｜end▁of▁sentence｜>", "\n").split():
        value = value.strip(",")
        if value:
            assert fmt.value_class(value) == TRAIN_VOCAB.value_parity, value


def test_conversation_ends_with_a_question_about_an_earlier_plant() -> None:
    messages = data.conversation(random.Random(3), 800)
    question, answer = messages[-2].content, messages[-1].content
    assert question.startswith("What ") and answer
    earlier = " ".join(m.content for m in messages[:-2])
    assert all(part.strip() in earlier for part in answer.split(","))


def test_train_attention_equals_the_reference() -> None:
    g = torch.Generator().manual_seed(0)
    q, kv = torch.randn(40, 4, 16, generator=g), torch.randn(30, 16, generator=g)
    idx = torch.randint(0, 30, (40, 12), generator=g)
    idx[:, 9:] = -1
    idx[3] = -1
    sink = torch.randn(4, generator=g)
    ref = sparse_attention_ref(q, kv, idx.int(), sink, 0.25)
    assert torch.allclose(train_attention(q, kv, idx, sink, 0.25), ref, atol=1e-6)


@pytest.fixture(scope="module")
def model():
    m = random_model(TrainConfig().model_args(), 0)
    m.ops = training_ops()
    return m


def test_batched_forward_equals_one_sequence_at_a_time(model) -> None:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(16, 272, (3, 300), generator=g)
    with torch.no_grad():
        batched = model.forward_batch(tokens, TrainHooks())
        single = torch.stack([model(t) for t in tokens])
    assert torch.allclose(batched, single, atol=1e-4, rtol=1e-4)


def test_dense_warmup_trains_the_indexer_and_steps_reduce_the_loss(model) -> None:
    torch.manual_seed(0)
    for _, p in model.named_parameters():
        p.requires_grad_(True)
    sample = data.sample(random.Random(11), 300)
    tok = torch.tensor([sample.ids])
    w = torch.tensor([sample.weights])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        loss, stats, loads = train_step(model, tok, w, True, TrainConfig())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(stats["loss"])
    assert stats["indexer_kl"] > 0 and loads  # the indexer is distilled, loads are recorded
    assert model.layers[2].attn.indexer.wq_b.weight.grad is not None
    assert losses[-1] < losses[0]


def test_the_curriculum_starts_with_codes_only_and_ends_with_the_full_mix() -> None:
    from dsv4bisect.reference.training.train import make_batch, stage

    cfg = TrainConfig()
    assert stage(cfg, 0.0) == (128, 512, "codes")
    assert stage(cfg, 0.3)[2] == "copy" and stage(cfg, 0.9) == (1024, 4096, "full")
    assert stage(TrainConfig(curriculum=((0.0, 256, 512),)), 0.5) == (256, 512, "full")
    tok = ByteTokenizer()
    for mix, kinds_seen in (("codes", set()), ("full", set())):
        for s in range(6):
            ids, _ = make_batch(0, s, 400, 500, 4096, 4, mix)
            text = "".join(tok.decode(x) for x in ids)
            kinds_seen.update(k for k, marker in (("code", "the code for"),
                                                  ("line", "the line for"),
                                                  ("var", "What is the value of"))
                              if marker in text)
            if mix == "codes":
                assert "the line for" not in text and "What is the value of" not in text
                assert "What are the codes for" not in text  # no two-key questions yet
        assert "code" in kinds_seen
        if mix == "full":
            assert kinds_seen == {"code", "line", "var"}


def test_a_stage_ends_at_its_gate_or_at_the_next_deadline() -> None:
    from dsv4bisect.reference.training.train import next_stage

    cfg = TrainConfig(gate=0.6, min_stage_steps=300)  # deadlines 0, 0.3, 0.5, 0.65
    assert next_stage(cfg, 0, 0.1, 400, 0.7) == 1  # passed the gate after enough steps
    assert next_stage(cfg, 0, 0.1, 200, 0.9) == 0  # too few steps in the stage
    assert next_stage(cfg, 0, 0.1, 400, 0.5) == 0  # below the gate
    assert next_stage(cfg, 0, 0.31, 10, None) == 1  # the deadline moves on regardless
    assert next_stage(cfg, 1, 0.7, 10, 0.0) == 3  # a late stage catches up with the clock
    assert next_stage(cfg, 3, 0.9, 900, 1.0) == 3  # the last stage stays


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.json")), ids=lambda p: p.stem)
def test_every_recipe_loads_and_keeps_the_shipped_mechanisms(recipe) -> None:
    """`--config RECIPE` must not fail on a GPU box, and a recipe changes the model's size or
    routing, never drops a DeepSeek-V4 mechanism (hash layers, CSA + HCA, mHC)."""
    cfg = dataclasses.replace(TrainConfig(), **json.loads(recipe.read_text()))
    a = cfg.model_args()
    assert a.num_hash_layers == 3 and a.hc_mult == 4 and a.index_topk > 0
    assert {4, 16} <= set(a.compress_ratios) and 0 < a.num_experts_per_tok <= a.n_routed_experts


def test_resumable_state_round_trips_in_small_shards(tmp_path) -> None:
    from dsv4bisect.reference.training.train import (
        SHARD_BYTES,
        load_state,
        optimize,
        optimizer,
        save_state,
        trainable,
    )

    cfg = TrainConfig()
    a = random_model(cfg.model_args(), 0)
    a.ops = training_ops()
    opt = optimizer(trainable(a), cfg)
    sample = data.sample(random.Random(5), 200)
    tok, w = torch.tensor([sample.ids]), torch.tensor([sample.weights])
    optimize(a, opt, cfg, tok, w, 1e-3, True)
    save_state(tmp_path / "state", a, opt, {"step": 1})
    shards = sorted((tmp_path / "state").glob("shard-*.pt"))
    assert len(shards) > 1 and all(f.stat().st_size <= SHARD_BYTES + (1 << 20) for f in shards)
    b = random_model(cfg.model_args(), 1)
    opt_b = optimizer(trainable(b), cfg)
    meta = load_state(tmp_path / "state", b, opt_b, torch.device("cpu"))
    assert meta["step"] == 1
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name
    sa, sb = opt.state_dict()["state"], opt_b.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for i in sa:  # the second moment in bf16, the first restarts at zero
        x, y = sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]
        assert torch.allclose(x, y, rtol=1e-2, atol=1e-36)  # atol: fp32 subnormals
        assert not sb[i]["exp_avg"].any()
