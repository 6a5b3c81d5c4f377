"""Training the embedded checkpoint: data, the batched forward, the differentiable ops, a step."""

from __future__ import annotations

import random

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
    assert stage(cfg, 0.3)[2] == "full" and stage(cfg, 0.9) == (1024, 4096, "full")
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
