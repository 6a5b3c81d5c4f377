"""Where a training step's time goes on a GPU (a diagnostic, run by hand on the H200).

    python tests/benchmarks/train_profile.py [--length 1024] [--batch 16] [--steps 3]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from dsv4bisect.reference.checkpoint import random_model
from dsv4bisect.reference.training import ops as train_ops
from dsv4bisect.reference.training.train import (
    TrainConfig,
    make_batch,
    to_tensors,
    train_step,
    trainable,
)


def embedding_attention(q, kv, indices, sink, scale, **kw):  # noqa: ANN001, ANN201
    """Variant: gather rows with F.embedding (sort-based backward, no atomics)."""
    valid = indices >= 0
    rows = F.embedding(indices.clamp(min=0).long(), kv)
    logits = torch.einsum("nhd,nkd->nhk", q, rows) * scale
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    sink_col = sink.view(1, -1, 1).expand(q.shape[0], -1, 1)
    probs = torch.softmax(torch.cat((logits, sink_col), dim=-1), dim=-1)[..., :-1]
    return torch.einsum("nhk,nkd->nhd", probs, rows)


def timed(model, tok, w, dense, steps) -> float:  # noqa: ANN001
    cfg = TrainConfig()
    for _ in range(1):
        loss, _, _ = train_step(model, tok, w, dense, cfg)
        loss.backward()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss, _, _ = train_step(model, tok, w, dense, cfg)
        loss.backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    model = random_model(TrainConfig().model_args(), 0, dev)
    model.ops = train_ops.training_ops()
    trainable(model)
    ids, w = make_batch(0, 1, a.length, a.length, a.length * a.batch, a.batch)
    tok, w = to_tensors(ids, w, dev)
    for dense in (True, False):
        print(f"dense={dense} gather: {timed(model, tok, w, dense, a.steps):.3f} s/step", flush=True)
    model.ops = train_ops.Ops(embedding_attention, model.ops.indexer, model.ops.indexer_patched)
    for dense in (True, False):
        print(f"dense={dense} embedding: {timed(model, tok, w, dense, a.steps):.3f} s/step",
              flush=True)
    model.ops = train_ops.training_ops()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        loss, _, _ = train_step(model, tok, w, False, TrainConfig())
        loss.backward()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
