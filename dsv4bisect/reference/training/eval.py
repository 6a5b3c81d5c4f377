"""Retrieval accuracy of a model in training, on held-out conversations of the training format.

Held-out = another seed of the training generator (training vocabulary): the probe's own
vocabulary stays unseen until `dsv4bisect run` measures the shipped checkpoint with it.
"""

from __future__ import annotations

import random

import torch

from dsv4bisect.reference.chat import apply_chat_template
from dsv4bisect.reference.model import Transformer
from dsv4bisect.reference.tokenizer import EOS_ID, ByteTokenizer
from dsv4bisect.reference.training import data

_TOK = ByteTokenizer()


def greedy(model: Transformer, prompt: list[int], max_new: int) -> list[int]:
    """Greedy continuation of `prompt` with the KV cache (stops after eos)."""
    device = model.embed.weight.device
    cache = model.new_cache()
    h = model.forward_hidden(torch.tensor(prompt, device=device), cache)
    out: list[int] = []
    logits = model.logits(h[-1:])
    for _ in range(max_new):
        token = int(torch.argmax(logits[0]))
        out.append(token)
        if token == EOS_ID:
            break
        logits = model.logits(model.forward_hidden(torch.tensor([token], device=device), cache))
    return out


def retrieval_accuracy(model: Transformer, seed: int, lengths: tuple[int, ...],
                       cases: int) -> dict[str, float]:
    """Share of final questions answered exactly, per conversation length."""
    result: dict[str, float] = {}
    for length in lengths:
        right = 0
        for i in range(cases):
            messages = data.conversation(random.Random(f"eval:{seed}:{length}:{i}"), length)
            prompt = apply_chat_template(messages[:-1], add_generation_prompt=True)
            expected = messages[-1].content
            answer = greedy(model, prompt, len(expected) + 4)
            text = _TOK.decode([t for t in answer if t != EOS_ID])
            right += text.strip() == expected
        result[str(length)] = right / cases
    return result
