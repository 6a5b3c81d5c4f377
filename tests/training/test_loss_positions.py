"""The data/loss path of the trainer: answers weighted where they are, answerable from the
context before the question, and the answer CE taken at the shifted (predicting) positions."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from dsv4bisect.reference.chat import apply_chat_template
from dsv4bisect.reference.checkpoint import random_model
from dsv4bisect.reference.config import ModelArgs
from dsv4bisect.reference.tokenizer import EOS_ID, ByteTokenizer
from dsv4bisect.reference.training import data
from dsv4bisect.reference.training.ops import training_ops
from dsv4bisect.reference.training.train import TrainConfig, to_tensors, train_step

TOK = ByteTokenizer()


def _spans(weights: list[float], value: float) -> list[tuple[int, int]]:
    """[start, end) runs of positions whose weight is exactly `value`."""
    out, i = [], 0
    while i < len(weights):
        if weights[i] != value:
            i += 1
            continue
        j = i
        while j < len(weights) and weights[j] == value:
            j += 1
        out.append((i, j))
        i = j
    return out


def test_every_weighted_answer_is_an_assistant_answer_recoverable_from_earlier_context() -> None:
    for seed in range(12):
        messages = data.conversation(random.Random(seed), 900)
        ids = apply_chat_template(messages, add_generation_prompt=False)
        weights, questions = data.weights_for(ids)
        answers = [m.content for m in messages if m.role == "assistant" and m.content != "OK."]
        spans = _spans(weights, data.ANSWER)
        assert questions == len(answers) == len(spans)
        for (start, end), answer in zip(spans, answers, strict=True):
            assert ids[end - 1] == EOS_ID  # the span is the answer and its eos, nothing else
            assert TOK.decode(ids[start : end - 1]) == answer
            context = TOK.decode([t for t in ids[:start] if t >= 16])
            question = context[context.rindex("What ") :]
            before = context[: -len(question)]
            for value in answer.split(", "):  # every value was planted before its question
                assert value in before, (seed, value)


def test_answer_ce_is_the_cross_entropy_of_predicting_the_answer_tokens() -> None:
    torch.manual_seed(0)
    args = ModelArgs.preset("tiny").with_(
        hidden_size=64, num_hidden_layers=2, compress_ratios=(0, 4), num_hash_layers=1,
        n_routed_experts=4, moe_intermediate_size=32, q_lora_rank=32, o_lora_rank=16,
        head_dim=32, index_head_dim=32, sliding_window=16, num_nextn_predict_layers=0)
    model = random_model(args, 0)
    model.ops = training_ops()
    samples = [data.sample(random.Random(f"ce:{i}"), 200) for i in range(2)]
    tok, w = to_tensors([s.ids for s in samples], [s.weights for s in samples],
                        torch.device("cpu"))
    with torch.no_grad():
        _, stats, _ = train_step(model, tok, w, False, TrainConfig())
        logits = model.forward_batch(tok, None)
    logp = F.log_softmax(logits, -1)
    nll = [-float(logp[b, j - 1, tok[b, j]])  # token j is predicted from position j - 1
           for b, s in enumerate(samples) for j, x in enumerate(s.weights) if x == data.ANSWER]
    assert abs(stats["answer_ce"] - sum(nll) / len(nll)) < 1e-3
