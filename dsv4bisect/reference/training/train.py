"""Train the embedded engine's checkpoint to retrieve facts from long multi-turn conversations.

    python -m dsv4bisect.reference.training.train --out DIR [--minutes 9] [--device cuda]
        [--resume] [--config FILE.json]

Seeded (data for step s comes from (seed, s)), resumable (`--resume` continues from
DIR/state.pt), and it logs the loss curve to DIR/log.jsonl. Imports only torch, the model code
and the probe's conversation formats, so it runs on a GPU box with nothing else installed.

Recipe (docs/training.md): the schedule follows the wall-clock
budget (the box gives one ten-minute run). The first `dense_frac` of the budget, CSA layers
attend to every visible compressed entry while the lightning indexer learns to predict that
attention (KL distillation, as DeepSeek-V3.2 trains its indexer); after it, CSA attends to the
indexer's top-k and the distillation continues on the real path. Length and difficulty grow
(`curriculum`): codes only at 128–512 tokens first, then the full mix up to 4096 tokens
(docs/training.md), at a constant number of tokens per step. The routed experts are
balanced without an auxiliary loss (DeepSeek-V3's bias update). The checkpoint is written as
bf16 safetensors shards with an index, in DeepSeek's names.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from dsv4bisect.reference.checkpoint import (
    load_model,
    random_model,
    save_checkpoint,
    state_tensors,
)
from dsv4bisect.reference.config import ModelArgs
from dsv4bisect.reference.model import TrainHooks, Transformer
from dsv4bisect.reference.tokenizer import PAD_ID
from dsv4bisect.reference.training import data
from dsv4bisect.reference.training.eval import retrieval_accuracy
from dsv4bisect.reference.training.ops import training_ops

# The shipped architecture: `tiny` with a 32-token window and 32 indexer picks, so a CSA key
# list (32 entries + 32 window tokens) always fits one 64-key split and an HCA list needs a
# second split from ~500 tokens on (what the split-K merge fault breaks); no MTP layer.
MODEL_CHANGES: dict[str, Any] = {
    "sliding_window": 32,
    "index_topk": 32,
    "compress_ratios": (0, 0, 4, 16, 4, 16),
    "num_nextn_predict_layers": 0,
    "max_position_embeddings": 65536,
}


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    minutes: float = 9.0
    tokens_per_step: int = 16384  # a step holds min(max_batch, tokens_per_step // length) sequences
    max_batch: int = 32  # short early stages fill the GPU only with many sequences
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    dense_frac: float = 0.2  # share of the budget with dense CSA attention
    indexer_weight: float = 1.0
    bias_update: float = 1e-3  # aux-loss-free expert balancing step
    # (fraction of the budget, shortest, longest sequence length, data.MIXES name) from that
    # point on: difficulty grows with length (docs/training.md); a 3-tuple means "full"
    curriculum: tuple[tuple[Any, ...], ...] = ((0.0, 128, 512, "codes"),
                                               (0.25, 512, 1024, "full"),
                                               (0.5, 1024, 4096, "full"))
    eval_lengths: tuple[int, ...] = (512, 2048, 4096)
    eval_cases: int = 8
    workers: int = 6
    model: dict[str, Any] = field(default_factory=lambda: dict(MODEL_CHANGES))

    def model_args(self) -> ModelArgs:
        return ModelArgs.preset("tiny").with_(**self.model)


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    warm = min(1.0, (step + 1) / cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.lr * warm * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * cosine)


def stage(cfg: TrainConfig, progress: float) -> tuple[int, int, str]:
    """(shortest, longest, mix name) of the curriculum stage at `progress` of the budget."""
    current = cfg.curriculum[0]
    for entry in cfg.curriculum:
        if progress >= entry[0]:
            current = entry
    lo, hi = current[1], current[2]
    mix = current[3] if len(current) > 3 else "full"
    if mix not in data.MIXES:
        raise ValueError(f"curriculum mix {mix!r}: one of {sorted(data.MIXES)}")
    return lo, hi, mix


def make_batch(seed: int, step: int, lo: int, hi: int, tokens: int,
               max_batch: int, mix: str = "full") -> tuple[list, list]:
    """Step `step`'s sequences: one length drawn in [lo, hi], as many as fit `tokens`."""
    rng = random.Random(f"{seed}:{step}")
    length = rng.randrange(lo, hi + 1)
    samples = [data.sample(random.Random(f"{seed}:{step}:{i}"), length, mix=data.MIXES[mix])
               for i in range(max(1, min(max_batch, tokens // length)))]
    return [s.ids for s in samples], [s.weights for s in samples]


def to_tensors(ids: list, weights: list, device: torch.device) -> tuple[torch.Tensor, ...]:
    width = max(map(len, ids))
    tok = torch.full((len(ids), width), PAD_ID, dtype=torch.long)
    w = torch.zeros(len(ids), width)
    for i, (a, b) in enumerate(zip(ids, weights, strict=True)):
        tok[i, : len(a)] = torch.tensor(a)
        w[i, : len(b)] = torch.tensor(b)
    return tok.to(device), w.to(device)


def train_step(model: Transformer, tok: torch.Tensor, w: torch.Tensor, dense: bool,
               cfg: TrainConfig) -> tuple[torch.Tensor, dict[str, float], dict[int, torch.Tensor]]:
    hooks = TrainHooks(dense_csa=dense, dense_experts=True, indexer_losses=[], expert_loads={})
    logits = model.forward_batch(tok, hooks)[:, :-1]  # predicts tokens 1..T-1
    target, weight = tok[:, 1:], w[:, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                         reduction="none").view_as(weight)
    lm = (ce * weight).sum() / weight.sum()
    answer_mask = weight >= data.ANSWER
    answer = (ce * answer_mask).sum() / answer_mask.sum().clamp(min=1)
    idx = torch.stack(hooks.indexer_losses).mean() if hooks.indexer_losses else lm.new_zeros(())
    loss = lm + cfg.indexer_weight * idx
    stats = {k: float(v.detach()) for k, v in
             (("loss", loss), ("lm", lm), ("answer_ce", answer), ("indexer_kl", idx))}
    return loss, stats, hooks.expert_loads or {}


def optimize(model: Transformer, opt: torch.optim.Optimizer, cfg: TrainConfig, tok: torch.Tensor,
             w: torch.Tensor, lr: float, dense: bool) -> tuple[dict[str, float], float]:
    """One optimiser step at learning rate `lr`: loss, backward, clip, step, expert balancing.
    Returns the step's stats and the gradient norm before clipping."""
    for group in opt.param_groups:
        group["lr"] = lr
    loss, stats, loads = train_step(model, tok, w, dense, cfg)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    balance_experts(model, loads, cfg.bias_update)
    return stats, float(norm)


def balance_experts(model: Transformer, loads: dict[int, torch.Tensor], step_size: float) -> None:
    """Aux-loss-free balancing: raise the selection bias of under-used experts (DeepSeek-V3)."""
    with torch.no_grad():
        for layer, load in loads.items():
            gate = model.layers[layer].ffn.gate
            if gate.is_hash:
                continue
            load = load.float()
            gate.bias += step_size * torch.sign(load.mean() - load)


def trainable(model: Transformer) -> list[torch.nn.Parameter]:
    params = []
    for name, p in model.named_parameters():
        p.requires_grad_(not name.endswith("gate.bias"))  # the bias is balanced, not learned
        if p.requires_grad:
            params.append(p)
    return params


def optimizer(params: list[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def save(out: Path, model: Transformer, opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    bf16 = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v)
            for k, v in state_tensors(model).items()}
    save_checkpoint(out / "checkpoint", model.a, bf16, max_shard_bytes=8 << 20)
    tmp = out / "state.pt.tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), **state}, tmp)
    tmp.replace(out / "state.pt")


def run(out: Path, cfg: TrainConfig, device: torch.device, resume: bool,
        init_from: Path | None = None) -> dict[str, Any]:
    # Data workers fork before CUDA is initialised in this process.
    pool = ProcessPoolExecutor(cfg.workers) if cfg.workers > 0 else None
    torch.manual_seed(cfg.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    if init_from is not None:  # continue from a checkpoint directory (weights only)
        model = load_model(init_from, device)
        if model.a != cfg.model_args():
            raise SystemExit(f"{init_from} has another architecture than this config")
    else:
        model = random_model(cfg.model_args(), cfg.seed, device)
    model.ops = training_ops(device)
    model.train()
    opt = optimizer(trainable(model), cfg)
    step, elapsed0 = 0, 0.0
    if resume and (out / "state.pt").exists():
        st = torch.load(out / "state.pt", map_location=device, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed0 = st["step"], st["elapsed_s"]
    budget = cfg.minutes * 60
    log = (out / "log.jsonl").open("a")
    t0 = time.monotonic() - elapsed0

    def submit(s: int, progress: float):  # noqa: ANN202 - a future or a ready batch
        lo, hi, mix = stage(cfg, progress)
        args = (cfg.seed, s, lo, hi, cfg.tokens_per_step, cfg.max_batch, mix)
        return pool.submit(make_batch, *args) if pool else make_batch(*args)

    pending = submit(step, (time.monotonic() - t0) / budget)
    while (time.monotonic() - t0) < budget:
        progress = (time.monotonic() - t0) / budget
        batch = pending.result() if pool else pending
        pending = submit(step + 1, progress)
        tok, w = to_tensors(*batch, device)
        stats, norm = optimize(model, opt, cfg, tok, w, lr_at(cfg, step, progress),
                               progress < cfg.dense_frac)
        step += 1
        if step % 10 == 0 or step == 1:  # every 10th step to the log, every 100th to stdout
            rec = {"step": step, "elapsed_s": round(time.monotonic() - t0, 1),
                   "seq_len": tok.shape[1], "batch": tok.shape[0], "lr": lr_at(cfg, step, progress),
                   "grad_norm": float(norm), "dense_csa": progress < cfg.dense_frac, **stats}
            log.write(json.dumps(rec) + "\n")
            log.flush()
            if step % 100 == 0 or step == 1:
                print(json.dumps(rec), flush=True)
    if pool:
        pool.shutdown(cancel_futures=True)
    elapsed = time.monotonic() - t0
    save(out, model, opt, {"step": step, "elapsed_s": elapsed, "config": dataclasses.asdict(cfg)})
    model.eval()
    with torch.no_grad():
        acc = retrieval_accuracy(model, cfg.seed + 1, cfg.eval_lengths, cfg.eval_cases)
    summary = {"steps": step, "elapsed_s": round(elapsed, 1), "eval": acc}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/state.pt")
    ap.add_argument("--init-from", type=Path, help="start from this checkpoint's weights")
    ap.add_argument("--config", type=Path, help="JSON with TrainConfig fields to override")
    a = ap.parse_args()
    cfg = TrainConfig()
    if a.config:
        cfg = dataclasses.replace(cfg, **json.loads(a.config.read_text()))
    if a.minutes is not None:
        cfg = dataclasses.replace(cfg, minutes=a.minutes)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "train_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    print(json.dumps(run(a.out, cfg, torch.device(a.device), a.resume, a.init_from), indent=2))


if __name__ == "__main__":
    main()
