"""Retrieval accuracy of a model in training, on held-out conversations of the training format.

Held-out = another seed of the training generator (training vocabulary): the probe's own
vocabulary stays unseen until `dsv4bisect run` measures the shipped checkpoint with it.
Two measures: `final_answer_scores` (one batched teacher-forced forward; exact match over the
answer and its eos equals greedy exact match, so it is cheap enough to gate the curriculum on)
and `retrieval_accuracy` (greedy decoding through the KV cache, as the engine serves).
"""

from __future__ import annotations

import random

import torch

from dsv4bisect.reference.chat import apply_chat_template
from dsv4bisect.reference.model import Transformer
from dsv4bisect.reference.tokenizer import EOS_ID, ByteTokenizer
from dsv4bisect.reference.training import data

_TOK = ByteTokenizer()


def final_answer_mask(weights: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: the last answer span of each row (the final question's answer and eos)."""
    ans = weights >= data.ANSWER
    mask = torch.zeros_like(ans)
    for b in range(ans.shape[0]):
        idx = ans[b].nonzero().flatten().tolist()
        j = len(idx) - 1
        while j > 0 and idx[j - 1] == idx[j] - 1:
            j -= 1
        mask[b, idx[j:]] = True
    return mask


@torch.no_grad()
def final_answer_scores(model: Transformer, tok: torch.Tensor,
                        w: torch.Tensor) -> dict[str, float]:
    """Final-question retrieval of B held-out rows through the inference path (indexer top-k).
    tok, w: [B, T] tokens and loss weights (`train.to_tensors`)."""
    logits = model.forward_batch(tok, None)[:, :-1]
    target, mask = tok[:, 1:], final_answer_mask(w)[:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    right = logits.argmax(-1) == target
    first = mask & ~torch.cat((mask[:, :1] & False, mask[:, :-1]), 1)  # first answer token
    digit = mask & (target != EOS_ID)
    return {"exact": float((right | ~mask).all(1).float().mean()),
            "digit_acc": float((right & digit).sum() / digit.sum()),
            "answer_ce": float((ce * mask).sum() / mask.sum()),
            "first_digit_ce": float((ce * first).sum() / first.sum())}


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


# ---- MTP draft acceptance on the probe's answers --------------------------------------------


def probe_cases(lengths: tuple[int, ...], cases: int,
                tiers: tuple[str, ...] = ("smoke", "standard")) -> list:
    """The probe's needle and copy cases of `tiers` (their depths, turns, distractors and copy
    lengths) at `lengths`, `cases` per cell; the probe's own vocabulary, unseen in training."""
    from dsv4bisect.probe.grid import build_cases
    from dsv4bisect.probe.layout import calibrate
    from dsv4bisect.probe.spec import tier_spec
    from dsv4bisect.probe.vocab import PROBE_VOCAB

    def count(messages: list) -> int:
        return len(apply_chat_template(messages, True))

    calib = calibrate(count, PROBE_VOCAB)
    out = []
    for tier in tiers:
        base = tier_spec(tier, families=("needle", "copy"))
        for length in lengths:  # turns that fit the length (~128 tokens a turn at least)
            turns = tuple(t for t in base.turns if 128 * t <= length)
            if not turns:  # e.g. the standard tier (8 or 32 turns) below 1024 tokens
                continue
            spec = base.replace(lengths=(length,), turns=turns, cases_per_cell=cases)
            out += build_cases(spec, PROBE_VOCAB, count, calib, (4, 16))
    return out


@torch.no_grad()
def probe_acceptance(model: Transformer, cases: list) -> dict[str, float]:
    """Greedy draft acceptance of the MTP layer on the answers of the probe's `cases`
    (`probe_cases`): each conversation is teacher-forced with its expected answer and eos; at
    every answer token the MTP layer drafts (all but the first: the main model's forward makes
    that one), the draft is accepted when the MTP layer's argmax (from the main streams two
    tokens back and the previous token) equals the main model's argmax for that token. Returns
    the acceptance over all drafted tokens and per family, the number of drafted tokens, and the
    share of answers the main model gets exactly right teacher-forced (for context)."""
    from dsv4bisect.reference.mtp import main_hidden_batch, mtp_logits_batch

    device = model.embed.weight.device
    agree: dict[str, int] = {}
    drafted: dict[str, int] = {}
    exact: list[bool] = []
    for case in cases:
        prompt = apply_chat_template(list(case.messages), add_generation_prompt=True)
        answer = _TOK.encode(case.expected) + [EOS_ID]
        tok = torch.tensor([prompt + answer], device=device)
        h = main_hidden_batch(model, tok)  # [T, n, dim]
        main_pick = model.logits(h).argmax(-1)  # [T]: main's choice for token t+1
        mtp_pick = mtp_logits_batch(model, h[:-1], tok[:, 1:])[0].argmax(-1)  # t -> token t+2
        p0 = len(prompt)  # first answer token
        positions = torch.arange(p0 + 1, p0 + len(answer), device=device)  # drafted tokens
        hits = int((mtp_pick[positions - 2] == main_pick[positions - 1]).sum())
        fam = case.family
        agree[fam] = agree.get(fam, 0) + hits
        drafted[fam] = drafted.get(fam, 0) + len(positions)
        exact.append(bool((main_pick[p0 - 1 : p0 - 1 + len(answer)] == tok[0, p0:]).all()))
    out = {f"accept_{f}": round(agree[f] / drafted[f], 4) for f in sorted(drafted)}
    out["accept"] = round(sum(agree.values()) / max(1, sum(drafted.values())), 4)
    out["drafted"] = sum(drafted.values())
    out["cases"] = len(cases)
    out["main_exact"] = round(sum(exact) / max(1, len(exact)), 4)
    return out
