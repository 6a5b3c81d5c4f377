"""Train the embedded engine's checkpoint to retrieve facts from long multi-turn conversations.

    python -m dsv4bisect.reference.training.train --out DIR [--minutes 24] [--stop-after 8.5]
        [--device cuda] [--resume] [--config FILE.json]

Seeded (data for step s comes from (seed, s)), resumable (`--resume` continues from the shards
in DIR/state/, each under 12 MB so a run can move between machines in pieces), and it logs the
loss curve to DIR/log.jsonl. Imports only torch, the model code and the probe's conversation
formats, so it runs on a GPU box with nothing else installed.

Recipe (docs/training.md): the learning-rate schedule follows the whole wall-clock budget
(`--minutes`, summed over resumed runs; `--stop-after` ends one run early with everything
saved). The first `dense_frac` of the budget, CSA layers attend to every visible compressed
entry while the lightning indexer learns to predict that attention (KL distillation, as
DeepSeek-V3.2 trains its indexer); after it, CSA attends to the indexer's top-k and the
distillation continues on the real path. Length and difficulty grow (`curriculum`): codes only
at short lengths first, then copy lines, then the full mix up to 4096 tokens. A stage ends when
held-out exact retrieval of its own task reaches `gate` (after `min_stage_steps`), or at the
next stage's deadline. The routed experts are balanced without an auxiliary loss (DeepSeek-V3's
bias update). The checkpoint is written as bf16 safetensors shards with an index, in DeepSeek's
names.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import shutil
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
from dsv4bisect.reference.mtp import save_mtp
from dsv4bisect.reference.tokenizer import PAD_ID
from dsv4bisect.reference.training import data
from dsv4bisect.reference.training.eval import (
    final_answer_scores,
    probe_acceptance,
    probe_cases,
    retrieval_accuracy,
)
from dsv4bisect.reference.training.mtp import mtp_model, mtp_scores, mtp_train_step, mtp_trainable
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
    # (deadline as a fraction of the budget, shortest, longest sequence length, data.MIXES
    # name): difficulty grows with length (docs/training.md); a 3-tuple means "full"
    curriculum: tuple[tuple[Any, ...], ...] = ((0.0, 128, 512, "codes"),
                                               (0.3, 256, 1024, "copy"),
                                               (0.5, 512, 2048, "full"),
                                               (0.65, 1024, 4096, "full"))
    gate: float = 0.6  # held-out exact retrieval of a stage's task that moves on early
    min_stage_steps: int = 300
    eval_every: int = 100  # steps between held-out evaluations (the gate, the log)
    gate_cases: int = 32
    eval_lengths: tuple[int, ...] = (512, 2048, 4096)
    eval_cases: int = 8
    workers: int = 6
    model: dict[str, Any] = field(default_factory=lambda: dict(MODEL_CHANGES))
    # Train only an MTP layer on this frozen main checkpoint (a directory or `embedded`;
    # training/mtp.py): `model` is then ignored, the held-out score is draft acceptance and the
    # result is `mtp.json` + `mtp.safetensors` (docs/training.md, "The MTP layer").
    mtp_main: str | None = None
    # Draft depths in the MTP loss, chained as the server drafts (1 = DeepSeek's objective alone);
    # `mtp_init`: start the MTP layer from the one beside this checkpoint, not from random.
    mtp_depths: int = 1
    mtp_init: str | None = None

    def model_args(self) -> ModelArgs:
        return ModelArgs.preset("tiny").with_(**self.model)


def lr_at(cfg: TrainConfig, step: int, progress: float) -> float:
    warm = min(1.0, (step + 1) / cfg.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.lr * warm * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * cosine)


def stage_spec(cfg: TrainConfig, index: int) -> tuple[int, int, str]:
    """(shortest, longest, mix name) of curriculum stage `index`."""
    entry = cfg.curriculum[index]
    mix = entry[3] if len(entry) > 3 else "full"
    if mix not in data.MIXES:
        raise ValueError(f"curriculum mix {mix!r}: one of {sorted(data.MIXES)}")
    return entry[1], entry[2], mix


def stage(cfg: TrainConfig, progress: float) -> tuple[int, int, str]:
    """The stage whose deadline `progress` of the budget has passed (no gate)."""
    return stage_spec(cfg, deadline_stage(cfg, progress))


def deadline_stage(cfg: TrainConfig, progress: float) -> int:
    return max(i for i, entry in enumerate(cfg.curriculum) if progress >= entry[0] or i == 0)


def next_stage(cfg: TrainConfig, current: int, progress: float, steps_in_stage: int,
               exact: float | None) -> int:
    """The curriculum stage after an evaluation: on when the held-out exact retrieval of the
    current stage's task passed the gate (and the stage had its minimum steps), or when the
    next stage's deadline has passed."""
    passed = exact is not None and exact >= cfg.gate and steps_in_stage >= cfg.min_stage_steps
    gated = min(current + 1, len(cfg.curriculum) - 1) if passed else current
    return max(gated, deadline_stage(cfg, progress))


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
    if cfg.mtp_main is not None:
        loss, stats, loads = mtp_train_step(model, tok, w, cfg.mtp_depths)
    else:
        loss, stats, loads = train_step(model, tok, w, dense, cfg)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for group in opt.param_groups for p in group["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
    opt.step()
    balance_experts(model, loads, cfg.bias_update)
    return stats, float(norm)


def balance_experts(model: Transformer, loads: dict[int, torch.Tensor], step_size: float) -> None:
    """Aux-loss-free balancing: raise the selection bias of under-used experts (DeepSeek-V3)."""
    with torch.no_grad():
        L = len(model.layers)
        for layer, load in loads.items():
            gate = (model.layers[layer] if layer < L else model.mtp[layer - L]).ffn.gate
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


SHARD_BYTES = 12 << 20  # resumable state in pieces small enough to move between machines


def save_state(directory: Path, model: Transformer, opt: torch.optim.Optimizer,
               meta: dict[str, Any], prefix: str = "") -> None:
    """What `--resume` needs, as torch files of at most SHARD_BYTES (40 MB in all for the
    shipped model, small enough to come back from a GPU box): fp32 weights, AdamW's second
    moment in bf16 (its rounding is far below the step noise) and meta.json. The first moment
    is left out: it restarts at zero and rebuilds within ~10 steps (beta1 = 0.9). `prefix`
    keeps only the weights under it (`mtp.`: the frozen main model is not state)."""
    opt_sd = opt.state_dict()
    tensors = {f"model.{k}": v for k, v in model.state_dict().items() if k.startswith(prefix)}
    for i, st in opt_sd["state"].items():
        tensors[f"opt.{i}.step"] = torch.as_tensor(st["step"]).float().cpu()
        tensors[f"opt.{i}.exp_avg_sq"] = st["exp_avg_sq"].to(torch.bfloat16)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t.cpu()
        size += nbytes
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for n, shard in enumerate(shards, 1):
        torch.save(shard, tmp / f"shard-{n:03d}.pt")
    meta = {**meta, "shards": len(shards), "param_groups": opt_sd["param_groups"]}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    tmp.replace(directory)


def load_state(directory: Path, model: Transformer, opt: torch.optim.Optimizer,
               device: torch.device) -> dict[str, Any]:
    """Restore `save_state`'s weights and optimiser moments; returns its meta."""
    meta = json.loads((directory / "meta.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for i in range(1, meta["shards"] + 1):
        # weights_only: a shard is a plain {name: tensor} dict, so nothing in a state directory
        # (which may come back from a remote GPU run) can run code when it is resumed
        tensors.update(torch.load(directory / f"shard-{i:03d}.pt", map_location=device,
                                  weights_only=True))
    weights = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
    prefix = meta.get("state_prefix", "")
    missing, unexpected = model.load_state_dict(weights, strict=not prefix)
    if unexpected or any(k.startswith(prefix) for k in missing):
        raise SystemExit(f"{directory}: the state does not fit the model ({unexpected[:4]}, "
                         f"{missing[:4]})")
    state: dict[int, dict[str, torch.Tensor]] = {}
    for k, v in tensors.items():
        if k.startswith("opt."):
            _, i, field_name = k.split(".")
            state.setdefault(int(i), {})[field_name] = v.cpu() if field_name == "step" else v
    for st in state.values():
        st["exp_avg"] = torch.zeros_like(st["exp_avg_sq"])
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return meta


def save(out: Path, model: Transformer, opt: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
    if meta["config"].get("mtp_main") is not None:  # the MTP layer alone, deployment format
        chain = {k: meta["config"][f"mtp_{k}"] for k in ("depths", "init")
                 if meta["config"].get(f"mtp_{k}") not in (None, 1)}
        save_mtp(out / "checkpoint", model.a, state_tensors(model),
                 {"steps": meta["step"], "elapsed_s": round(meta["elapsed_s"], 1), **chain})
        save_state(out / "state", model, opt, {**meta, "state_prefix": "mtp."}, prefix="mtp.")
        return
    bf16 = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v)
            for k, v in state_tensors(model).items()}
    save_checkpoint(out / "checkpoint", model.a, bf16, max_shard_bytes=8 << 20)
    save_state(out / "state", model, opt, meta)


def held_out(cfg: TrainConfig, index: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Held-out rows of stage `index`'s task at its longest length (another seed)."""
    _, hi, mix = stage_spec(cfg, index)
    rows = [data.sample(random.Random(f"held:{cfg.seed}:{index}:{i}"), hi, mix=data.MIXES[mix])
            for i in range(cfg.gate_cases)]
    return to_tensors([r.ids for r in rows], [r.weights for r in rows], device)


def run(out: Path, cfg: TrainConfig, device: torch.device, resume: bool,
        init_from: Path | None = None, stop_after: float | None = None) -> dict[str, Any]:
    # Data workers fork before CUDA is initialised in this process.
    pool = ProcessPoolExecutor(cfg.workers) if cfg.workers > 0 else None
    torch.manual_seed(cfg.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    if cfg.mtp_main is not None:  # the main model frozen, one new MTP layer (training/mtp.py)
        model = mtp_model(cfg.mtp_main, cfg.seed, device, cfg.mtp_init)
    elif init_from is not None:  # continue from a checkpoint directory (weights only)
        model = load_model(init_from, device)
        if model.a != cfg.model_args():
            raise SystemExit(f"{init_from} has another architecture than this config")
    else:
        model = random_model(cfg.model_args(), cfg.seed, device)
    model.ops = training_ops(device)
    model.train()
    opt = optimizer(mtp_trainable(model) if cfg.mtp_main is not None else trainable(model), cfg)
    score = (lambda m, t, w: {"exact": None, **mtp_scores(m, t, w, cfg.mtp_depths)}) if cfg.mtp_main is not None \
        else final_answer_scores
    step, elapsed0, current, stage_start = 0, 0.0, 0, 0
    if resume and (out / "state" / "meta.json").exists():
        meta = load_state(out / "state", model, opt, device)
        step, elapsed0 = meta["step"], meta["elapsed_s"]
        current, stage_start = meta["stage"], meta["stage_start"]
    budget = cfg.minutes * 60
    log = (out / "log.jsonl").open("a")
    t0 = time.monotonic() - elapsed0
    run_end = time.monotonic() + (stop_after * 60 if stop_after else budget)
    held = held_out(cfg, current, device)

    ahead: dict[int, Any] = {}  # step -> its batch (a future with workers): data keeps ahead

    def batch_for(s: int) -> tuple[list, list]:
        for k in range(s, s + max(1, cfg.workers)):
            if k not in ahead:
                lo, hi, mix = stage_spec(cfg, current)
                args = (cfg.seed, k, lo, hi, cfg.tokens_per_step, cfg.max_batch, mix)
                ahead[k] = pool.submit(make_batch, *args) if pool else args
        got = ahead.pop(s)
        return got.result() if pool else make_batch(*got)

    while (time.monotonic() - t0) < budget and time.monotonic() < run_end:
        progress = (time.monotonic() - t0) / budget
        tok, w = to_tensors(*batch_for(step), device)
        stats, norm = optimize(model, opt, cfg, tok, w, lr_at(cfg, step, progress),
                               progress < cfg.dense_frac)
        step += 1
        rec: dict[str, Any] = {}
        if step % cfg.eval_every == 0:
            model.eval()
            scores = score(model, *held)
            model.train()
            rec = {f"eval_{k}": round(v, 4) for k, v in scores.items() if v is not None}
            following = next_stage(cfg, current, progress, step - stage_start, scores["exact"])
        else:
            following = max(current, deadline_stage(cfg, progress))
        if following != current:  # by the gate only where the clock alone would not have moved
            by_gate = following > max(current, deadline_stage(cfg, progress))
            rec["stage_done"] = {"stage": current, "steps": step - stage_start,
                                 "by": "gate" if by_gate else "deadline"}
            current, stage_start = following, step
            held = held_out(cfg, current, device)
            if pool:  # batches drawn for the old stage
                for f in ahead.values():
                    f.cancel()
            ahead.clear()
        if step % 10 == 0 or step == 1 or rec:  # every 10th step to the log
            rec = {"step": step, "elapsed_s": round(time.monotonic() - t0, 1), "stage": current,
                   "seq_len": tok.shape[1], "batch": tok.shape[0],
                   "lr": lr_at(cfg, step, progress), "grad_norm": round(norm, 3),
                   "dense_csa": progress < cfg.dense_frac,
                   **{k: round(v, 4) for k, v in stats.items()}, **rec}
            log.write(json.dumps(rec) + "\n")
            log.flush()
            if step % cfg.eval_every == 0 or step == 1 or "stage_done" in rec:
                print(json.dumps(rec), flush=True)
    if pool:
        pool.shutdown(cancel_futures=True)
    elapsed = time.monotonic() - t0
    save(out, model, opt, {"step": step, "elapsed_s": elapsed, "stage": current,
                           "stage_start": stage_start, "config": dataclasses.asdict(cfg)})
    model.eval()
    with torch.no_grad():
        if cfg.mtp_main is not None:  # draft acceptance on the probe's needle and copy answers
            acc = probe_acceptance(model, probe_cases(cfg.eval_lengths, cfg.eval_cases))
        else:
            acc = retrieval_accuracy(model, cfg.seed + 1, cfg.eval_lengths, cfg.eval_cases)
    summary = {"steps": step, "elapsed_s": round(elapsed, 1), "stage": current,
               "finished": elapsed >= budget, "eval": acc}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--stop-after", type=float, default=None,
                    help="end this run after so many minutes, everything saved (resume later)")
    ap.add_argument("--resume", action="store_true", help="continue from OUT/state/")
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
    print(json.dumps(run(a.out, cfg, torch.device(a.device), a.resume, a.init_from, a.stop_after), indent=2))


if __name__ == "__main__":
    main()
