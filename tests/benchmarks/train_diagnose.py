"""Can the trainer learn retrieval at all? A small-scale CPU experiment (issue 7, docs/training.md).

    python tests/benchmarks/train_diagnose.py --arch small-dense --minutes 9 --out A.jsonl
    python tests/benchmarks/train_diagnose.py --arch small --minutes 9 --out B.jsonl

Trains a small DeepSeek-V4 (every mechanism of the shipped architecture, scaled down) with the
real trainer pieces (`data.sample`, `train.train_step`, `train.optimizer`, `balance_experts`) on
short conversations of the training generator, code facts only ("needle" with distractors),
and logs per step the answer cross-entropy, next to the guessing level (a model that knows the
format but not the context), and every `--eval-every` steps the exact-match retrieval accuracy
of the final question on held-out conversations through the inference path (indexer top-k, no
training hooks). Teacher-forced exact match over the answer and its eos equals greedy exact
match, so one batched forward measures it.

Architectures (`--arch`):
- `small-dense`: every layer a sliding-window layer whose window covers the whole conversation
  (an ordinary causal transformer): the plumbing check.
- `small`: the shipped layout scaled down: SWA 32, layers (SWA, CSA 4 + indexer, HCA 16, CSA 4),
  hash and score-routed experts, mHC: retrieval beyond the window must use the compressed paths.
- `shipped`: the exact shipped architecture (`train.MODEL_CHANGES` on `tiny`): slow on CPU.
Runs on one CPU thread by default (`--threads`); `--device cuda` runs the same on a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dsv4bisect.reference.checkpoint import random_model
from dsv4bisect.reference.config import ModelArgs
from dsv4bisect.reference.model import Transformer
from dsv4bisect.reference.tokenizer import BYTE_OFFSET
from dsv4bisect.reference.training import data
from dsv4bisect.reference.training.eval import final_answer_scores
from dsv4bisect.reference.training.ops import training_ops
from dsv4bisect.reference.training.train import (
    MODEL_CHANGES,
    TrainConfig,
    lr_at,
    optimize,
    optimizer,
    to_tensors,
    trainable,
)

_SMALL: dict[str, Any] = {
    "hidden_size": 128, "num_hidden_layers": 4, "compress_ratios": (0, 4, 16, 4),
    "num_hash_layers": 1, "n_routed_experts": 4, "moe_intermediate_size": 64,
    "q_lora_rank": 64, "o_lora_rank": 32, "head_dim": 32, "qk_rope_head_dim": 16,
    "index_head_dim": 32, "index_topk": 16, "sliding_window": 32,
    "num_nextn_predict_layers": 0, "vocab_size": 288,
}
ARCHS: dict[str, dict[str, Any]] = {
    "small": _SMALL,
    "small-dense": {**_SMALL, "sliding_window": 512, "compress_ratios": (0, 0, 0, 0)},
    "shipped": dict(MODEL_CHANGES),
}
CODE_ONLY = data.Mix(question=0.0, plant=0.5, kinds=(("code", 1.0),), multi_query=0.0)
_DIGITS = [BYTE_OFFSET + ord(c) for c in "0123456789"]


def guess_ce(ids: list[int], weights: list[float]) -> float:
    """Mean CE over answer tokens of a model that knows the value format but not the context:
    a 7-digit code = first digit 1-9, five free digits, a parity digit (5 choices), eos."""
    total, n, run = 0.0, 0, 0
    for t, w in zip(ids, weights, strict=True):
        if w < data.ANSWER:
            continue
        n += 1
        if t in _DIGITS:
            run += 1
            total += math.log(9) if run == 1 else math.log(5) if run == 7 else math.log(10)
        else:
            run = 0
    return total / max(n, 1)


def evaluate(model: Transformer, tok: torch.Tensor, w: torch.Tensor) -> dict[str, float]:
    return {f"eval_{k}": v for k, v in final_answer_scores(model, tok, w).items()}


def evaluate_all(model: Transformer, held: dict[int, tuple[torch.Tensor, ...]]) -> dict:
    """`evaluate` on each held-out set; unsuffixed keys are the last (the final task's) set."""
    out: dict[str, float] = {}
    for i, (target, (tok, w)) in enumerate(held.items()):
        for k, v in evaluate(model, tok, w).items():
            out[k if i == len(held) - 1 else f"{k}@{target}"] = round(v, 4)
    return out


def batch(seed: str, n: int, target: int, mix: data.Mix) -> tuple[list, list]:
    samples = [data.sample(random.Random(f"{seed}:{i}"), target, mix=mix) for i in range(n)]
    return [s.ids for s in samples], [s.weights for s in samples]


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    arch = ARCHS[args.arch]
    mix = CODE_ONLY if args.mix == "code" else data.Mix()
    cfg = replace(TrainConfig(), lr=args.lr, warmup_steps=args.warmup, model=arch,
                  indexer_weight=args.indexer_weight)
    margs: ModelArgs = cfg.model_args()
    device = torch.device(args.device)
    model = random_model(margs, args.seed, device)
    model.ops = training_ops(device)
    model.train()
    opt = optimizer(trainable(model), cfg)
    targets = [args.target] + ([args.target_late] if args.target_late else [])
    held = {t: to_tensors(*batch(f"held:{args.seed}", args.eval_cases, t, mix), device)
            for t in targets}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.open("w")
    t0, step = time.monotonic(), 0
    while step < args.steps and time.monotonic() - t0 < args.minutes * 60:
        target = args.target_late if args.target_late and step >= args.switch_step else args.target
        ids, weights = batch(f"{args.seed}:{step}", args.batch, target, mix)
        tok, w = to_tensors(ids, weights, device)
        progress = step / args.steps
        dense = step < args.dense_steps
        stats, norm = optimize(model, opt, cfg, tok, w, lr_at(cfg, step, progress), dense)
        step += 1
        rec: dict[str, Any] = {
            "step": step, "elapsed_s": round(time.monotonic() - t0, 1), "seq_len": tok.shape[1],
            "lr": lr_at(cfg, step, progress), "grad_norm": round(float(norm), 3),
            "dense_csa": dense, "guess_ce": round(sum(map(guess_ce, ids, weights)) / len(ids), 3),
            **{k: round(v, 4) for k, v in stats.items()}}
        if step % args.eval_every == 0 or step == 1:
            model.eval()
            rec.update(evaluate_all(model, held))
            model.train()
            print(json.dumps(rec), flush=True)
        log.write(json.dumps(rec) + "\n")
        log.flush()
    model.eval()
    final = {"arch": args.arch, "steps": step, "elapsed_s": round(time.monotonic() - t0, 1),
             "params": sum(p.numel() for p in model.parameters()), **evaluate_all(model, held)}
    log.write(json.dumps({"final": final}) + "\n")
    return final


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", choices=sorted(ARCHS), default="small-dense")
    ap.add_argument("--out", required=True, help="JSONL loss curve")
    ap.add_argument("--mix", choices=("code", "full"), default="code",
                    help="code facts only, or the trainer's full mix (guess_ce: codes only)")
    ap.add_argument("--steps", type=int, default=100000, help="cosine schedule length")
    ap.add_argument("--minutes", type=float, default=9.0, help="wall-clock budget")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--target", type=int, default=160, help="conversation target tokens")
    ap.add_argument("--target-late", type=int, default=0,
                    help="curriculum: conversation target from --switch-step on (0: none)")
    ap.add_argument("--switch-step", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--dense-steps", type=int, default=0, help="steps with dense CSA")
    ap.add_argument("--indexer-weight", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-cases", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU recipe check")
    print(json.dumps(run(ap.parse_args())))


if __name__ == "__main__":
    main()
