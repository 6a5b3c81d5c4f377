"""Training the MTP (NextN) layer on a frozen main model (`TrainConfig.mtp_main`).

DeepSeek-V3's MTP objective at depth 1: the MTP layer sees the main model's final streams at
position t and the embedding of token t+1 and predicts token t+2. With `depths` > 1 the loss also
covers the chained draft steps the server runs (SGLang's NEXTN/EAGLE loop): at depth k the one
MTP layer sees, at row r, its own depth-(k-1) output streams of row r-1 (before hc_head) and the
embedding of token r+1, and predicts token r+2 (`chained_logits`). The main model runs without
gradients on the inference path (indexer top-k, no training hooks), so its weights are never
touched: only `mtp.*` parameters are in the optimiser, the resumable state holds only them, and
the result is written as a file of its own beside the main checkpoint (`reference/mtp.py`).
The loss weights are the training data's (answers 1, acknowledgements 0.05, the rest 0.1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4bisect.config.checkpoints import checkpoint_dir
from dsv4bisect.reference.checkpoint import load_model, random_model
from dsv4bisect.reference.model import TrainHooks, Transformer
from dsv4bisect.reference.mtp import main_hidden_batch, mtp_streams_batch
from dsv4bisect.reference.training import data

# The MTP layer of the DeepSeek-V4 checkpoints is SWA-only (SGLang's COMPRESS_RATIO_NEXTN_LAYER).
MTP_RATIO = 0


def mtp_model(main: str, seed: int, device: torch.device, init: str | None = None
              ) -> Transformer:
    """The main checkpoint `main` (a directory or `embedded`) with one MTP layer: freshly
    initialised, or the MTP layer stored beside checkpoint `init` (dequantised to fp32); the main
    weights loaded as stored (dequantised to fp32)."""
    path = checkpoint_dir(main)
    if path is None:
        raise SystemExit("mtp_main: a trained main checkpoint is needed, not `random`")
    base = load_model(path, device)
    L = base.a.num_hidden_layers
    args = base.a.with_(num_nextn_predict_layers=1,
                        compress_ratios=tuple(base.a.compress_ratios[:L]) + (MTP_RATIO,))
    model = random_model(args, seed, device)
    missing, unexpected = model.load_state_dict(base.state_dict(), strict=False)
    if unexpected or any(not k.startswith("mtp.") for k in missing):
        raise SystemExit(f"main checkpoint does not fit: {unexpected[:4]} {missing[:4]}")
    if init is not None:
        init_path = checkpoint_dir(init)
        if init_path is None:
            raise SystemExit("mtp_init: a checkpoint directory with an MTP layer is needed")
        start = {k: v for k, v in load_model(init_path, device, mtp=True).state_dict().items()
                 if k.startswith("mtp.")}
        model.load_state_dict(start, strict=False)
    model.stored_formats, model.nvfp4_scales = base.stored_formats, base.nvfp4_scales
    return model


def mtp_trainable(model: Transformer) -> list[torch.nn.Parameter]:
    """Only the MTP layer learns (its router bias is balanced, not learned)."""
    params = []
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("mtp.") and not name.endswith("gate.bias"))
        if p.requires_grad:
            params.append(p)
    return params


def mtp_forward(model: Transformer, tok: torch.Tensor, train: TrainHooks | None,
                depths: int = 1) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """tok [B, T] -> (main logits [B, T-1, V] predicting tokens 1..T-1, per draft depth the MTP
    logits [B, T-2, V] predicting tokens 2..T-1). The main model runs without gradients."""
    B, T = tok.shape
    with torch.no_grad():
        h = main_hidden_batch(model, tok)  # [B·T, n, dim]
        main_logits = model.logits(h).view(B, T, -1)[:, :-1]
    n, d = h.shape[1:]
    h_prev = h.view(B, T, n, d)[:, :-1].reshape(-1, n, d)  # streams of tokens 0..T-2
    return main_logits, [lg[:, :-1] for lg in chained_logits(model, h_prev, tok[:, 1:], train,
                                                             depths)]


def chained_logits(model: Transformer, h: torch.Tensor, next_tokens: torch.Tensor,
                   train: TrainHooks | None, depths: int) -> list[torch.Tensor]:
    """The MTP layer's logits [B, T, V] at draft depths 1..`depths`, teacher-forced: depth 1
    reads the main streams `h` [B·T, n, dim]; depth k > 1 reads at row r the depth-(k-1) output
    streams of row r-1 (row 0, which has none, keeps the main streams), as the server's chained
    draft step reads its previous step's output."""
    B, T = next_tokens.shape
    out = []
    for _ in range(depths):
        x, logits = mtp_streams_batch(model, h, next_tokens, train)
        out.append(logits)
        n, d = x.shape[1:]
        x = x.view(B, T, n, d)
        h = torch.cat((h.view(B, T, n, d)[:, :1], x[:, :-1]), 1).reshape(-1, n, d)
    return out


def mtp_train_step(model: Transformer, tok: torch.Tensor, w: torch.Tensor, depths: int = 1
                   ) -> tuple[torch.Tensor, dict[str, float], dict[int, torch.Tensor]]:
    """The mean over draft depths of the data-weighted CE of token t+2."""
    hooks = TrainHooks(dense_experts=True, expert_loads={})
    _, per_depth = mtp_forward(model, tok, hooks, depths)
    target, weight = tok[:, 2:], w[:, 2:]
    answer_mask = weight >= data.ANSWER
    loss, stats = torch.zeros((), device=tok.device), {}
    for k, logits in enumerate(per_depth, 1):
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                             reduction="none").view_as(weight)
        loss = loss + (ce * weight).sum() / weight.sum() / len(per_depth)
        answer = (ce * answer_mask).sum() / answer_mask.sum().clamp(min=1)
        stats["answer_ce" if k == 1 else f"answer_ce_d{k}"] = float(answer.detach())
    stats = {"loss": float(loss.detach()), "lm": float(loss.detach()), **stats}
    return loss, stats, hooks.expert_loads or {}


def drafted_mask(weights: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: the answer tokens an MTP layer drafts (every answer token and its eos but
    the first of each answer, which the main model's own forward produces)."""
    ans = weights >= data.ANSWER
    first = ans & ~torch.cat((torch.zeros_like(ans[:, :1]), ans[:, :-1]), 1)
    return ans & ~first


@torch.no_grad()
def mtp_scores(model: Transformer, tok: torch.Tensor, w: torch.Tensor, depths: int = 1
               ) -> dict[str, float]:
    """Teacher-forced draft acceptance on held-out rows: the share of drafted answer tokens
    (`drafted_mask`) where the MTP layer's argmax equals the main model's argmax at the same
    position (`accept` at depth 1, `accept_dK` at chained depth K); and the depth-1 CE on them."""
    main_logits, per_depth = mtp_forward(model, tok, None, depths)
    mask = drafted_mask(w)[:, 2:]  # token j, for j >= 2
    main_pick = main_logits[:, 1:].argmax(-1)  # main's choice for tokens 2..T-1
    n = mask.sum().clamp(min=1)
    out = {}
    for k, logits in enumerate(per_depth, 1):
        agree = (logits.argmax(-1) == main_pick) & mask
        out["accept" if k == 1 else f"accept_d{k}"] = float(agree.sum() / n)
    ce = F.cross_entropy(per_depth[0].transpose(1, 2), tok[:, 2:], reduction="none")
    return {**out, "mtp_answer_ce": float((ce * mask).sum() / n)}
