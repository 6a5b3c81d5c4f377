"""How far re-chunking or re-batching the same request moves the embedded engine's logits.

    python tests/benchmarks/batch_variation.py --transcripts RUN_DIR/baseline/drift.jsonl \
        [--precisions deployment,exact] [--by-rule | --only-by-rule] [--device cpu|cuda]
        [--json OUT.json]

Teacher-forced, on the drift transcripts of a `dsv4bisect run` (its baseline's `drift.jsonl`,
as `precision_drift.py`), shipped checkpoint, no patch. Full-vocabulary mean KL and top-1
agreement of the same configuration against itself under changes a server makes on its own:

- `chunk 512` / `chunk 77`: prefill chunked at 512 or 77 tokens instead of 2048
  (`Transformer.forward_hidden` per chunk, one cache per sequence);
- `batch of 4`: the first 256 tokens of each transcript alone (`forward_batch`, B = 1) against
  the same tokens as the first row of a batch with the three other transcripts' first 256
  tokens (B = 4, so the token-wise ops see 1024 tokens);
- `decoded`: the last 64 positions of each transcript fed one token per forward (as decode
  steps, after the rest was prefilled at 2048) against the same positions in the 2048 prefill.

At `precision: deployment` the engine takes the kernel decisions SGLang 0.5.23 takes for the same
batch of DeepSeek-V4-Flash on an H200 (`reference/dispatch.py`: the mHC pre-norm split-K and
kernel, FlashMLA's split-KV schedule, evaluated at Flash's shapes with the batch's real token
counts and positions); at `exact` every op is one fp32 kernel whatever the batch.

`--device cuda` runs the model on the GPU (its Triton kernels, cuBLAS choosing the GEMMs by
shape, beside the dispatch rules); the log-probs are compared on the CPU in fp32 either way.
The JSON records the device's name.

With `--by-rule` (deployment only) the batch-mates row again with one rule acting alone: the mHC
pre-norm rule with no FlashMLA cut, and FlashMLA's schedule with the TF32 pre-norm GEMM held at
4 splits (its count at 2048 tokens).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from precision_drift import drift  # beside this file

from dsv4bisect.config.checkpoints import EMBEDDED_CHECKPOINT
from dsv4bisect.reference import model as model_module
from dsv4bisect.reference.dispatch import MhcPrePlan, fit_mhc_plan
from dsv4bisect.reference.engine import ReferenceEngine
from dsv4bisect.reference.model import Transformer

BASE_CHUNK = 2048
CHUNKS = (512, 77)
BATCH_TOKENS = 256
DECODED = 64


def _host(x: torch.Tensor) -> torch.Tensor:
    """Log-probs to the CPU in fp32, where every comparison is made."""
    return x.float().cpu()


def chunked(model: Transformer, seqs: list[torch.Tensor], chunk: int) -> list[torch.Tensor]:
    """Log-probs [T, vocab] of each sequence, prefilled `chunk` tokens per forward."""
    out = []
    with torch.inference_mode():
        for s in seqs:
            cache = model.new_cache()
            hs = [model.forward_hidden(s[i:i + chunk], cache) for i in range(0, len(s), chunk)]
            out.append(_host(torch.log_softmax(model.logits(torch.cat(hs)), -1)))
    return out


def decoded_tail(model: Transformer, seqs: list[torch.Tensor]
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The last DECODED positions of each sequence: from the 2048 prefill and one token per
    forward; with the tokens of those positions."""
    prefilled, decoded, toks = [], [], []
    with torch.inference_mode():
        for s, full in zip(seqs, chunked(model, seqs, BASE_CHUNK), strict=True):
            cut = len(s) - DECODED
            cache = model.new_cache()
            for i in range(0, cut, BASE_CHUNK):
                model.forward_hidden(s[i:min(i + BASE_CHUNK, cut)], cache)
            hs = [model.forward_hidden(s[i:i + 1], cache) for i in range(cut, len(s))]
            decoded.append(_host(torch.log_softmax(model.logits(torch.cat(hs)), -1)))
            prefilled.append(full[cut:])
            toks.append(s[cut:].cpu())
    return prefilled, decoded, toks


def alone_and_batched(model: Transformer, seqs: list[torch.Tensor]
                      ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each sequence's first BATCH_TOKENS alone and as row 0 of a batch with the others."""
    heads = [s[:BATCH_TOKENS] for s in seqs]
    alone, batched = [], []
    with torch.inference_mode():
        for i, h in enumerate(heads):
            alone.append(_host(torch.log_softmax(model.forward_batch(h[None])[0], -1)))
            mates = [heads[j] for j in range(len(heads)) if j != i]
            batch = torch.stack([h, *mates])
            batched.append(_host(torch.log_softmax(model.forward_batch(batch)[0], -1)))
    return alone, batched


def held_at_four(plan: MhcPrePlan, hc_mult: int, hidden_size: int) -> MhcPrePlan:
    """`fit_mhc_plan` with the TF32 GEMM's split count held at 4 whatever the batch."""
    if plan.kernel == "tf32":
        return MhcPrePlan("tf32", 4)
    return fit_mhc_plan(plan, hc_mult, hidden_size)


BY_RULE: list[tuple[str, dict[str, Any]]] = [
    ("mHC rule only (no FlashMLA cut)", {"flashmla_segments": lambda *a, **k: None}),
    ("FlashMLA rule only (TF32 pre-norm at 4 splits)", {"fit_mhc_plan": held_at_four}),
]


def by_rule(model: Transformer, seqs: list[torch.Tensor]
            ) -> list[tuple[str, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]]:
    """The batch-mates row with each rule alone (the other replaced in the model module)."""
    rows = []
    for label, swap in BY_RULE:
        saved = {name: getattr(model_module, name) for name in swap}
        for name, fn in swap.items():
            setattr(model_module, name, fn)
        try:
            alone, batched = alone_and_batched(model, seqs)
        finally:
            for name, fn in saved.items():
                setattr(model_module, name, fn)
        rows.append((f"first {BATCH_TOKENS} tokens among 3 batch mates: {label}", alone, batched,
                     [s[:BATCH_TOKENS].cpu() for s in seqs]))
    return rows


def server_changes(model: Transformer, seqs: list[torch.Tensor]
                   ) -> list[tuple[str, list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]]:
    """The rows of changes a server makes on its own (module docstring)."""
    base = chunked(model, seqs, BASE_CHUNK)
    host = [s.cpu() for s in seqs]
    rows = [("same configuration again", base, chunked(model, seqs, BASE_CHUNK), host)]
    rows += [(f"prefill chunked at {c}", base, chunked(model, seqs, c), host) for c in CHUNKS]
    alone, batched = alone_and_batched(model, seqs)
    rows.append((f"first {BATCH_TOKENS} tokens among 3 batch mates", alone, batched,
                 [s[:BATCH_TOKENS] for s in host]))
    rows.append((f"last {DECODED} tokens decoded one per forward", *decoded_tail(model, seqs)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transcripts", type=Path, required=True, help="a run's drift.jsonl")
    ap.add_argument("--precisions", default="deployment,exact")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--by-rule", action="store_true", help="the batch row per rule (deployment)")
    ap.add_argument("--only-by-rule", action="store_true", help="only those rows")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda but torch sees no GPU\nhint: run it on a GPU machine")
    device_name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    seqs = [torch.tensor(json.loads(line)["input_ids"], device=a.device)
            for line in a.transcripts.read_text().splitlines() if line.strip()]
    if len(seqs) < 2 or min(len(s) for s in seqs) < BATCH_TOKENS:
        sys.exit(f"error: need at least 2 transcripts of {BATCH_TOKENS}+ tokens\n"
                 "hint: pass the baseline/drift.jsonl of a `dsv4bisect run`")
    results: list[dict[str, Any]] = []
    print("| precision | change | mean KL | p99 KL | top-1 | positions |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for precision in a.precisions.split(","):
        model = ReferenceEngine.load(EMBEDDED_CHECKPOINT, precision=precision, device=a.device,
                                     threads=1).model
        start = time.monotonic()
        rows = [] if a.only_by_rule else server_changes(model, seqs)
        if (a.by_rule or a.only_by_rule) and precision == "deployment":
            rows += by_rule(model, seqs)
        for label, ref, other, toks in rows:
            r = {"precision": precision, "change": label, "device": device_name,
                 **drift(ref, other, toks)}
            results.append(r)
            print(f"| {precision} | {label} | {r['kl_mean']:.3g} | {r['kl_p99']:.3g} | "
                  f"{r['top1']:.2%} | {r['positions']} |", flush=True)
        print(f"({precision}: {time.monotonic() - start:.0f} s)", file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
