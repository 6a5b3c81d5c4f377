"""Each patch's drift at both precisions, on the probe's own drift transcripts, in one process.

    python tests/benchmarks/precision_drift.py --transcripts RUN_DIR/baseline/drift.jsonl \
        [--precisions deployment,exact] [--json OUT.json]

For every row of `patch_effects.py` (real patches, their other variants, the faults): the
teacher-forced KL(all off ‖ patched) over the full vocabulary and the top-1 agreement, at every
position of the transcripts a `dsv4bisect run` scored (its baseline's `drift.jsonl`: the smoke
tier's four drift transcripts, 264–2057 tokens), with the shipped checkpoint, chunked prefill of
2048 as the profiles have it. `dsv4bisect run` computes the same KL from the servers' top-20
lists (a little lower); its gates: mean KL warn > 0.001, fail > 0.02. The mean is also split by
how well the all-off model predicts the token (NLL < 0.5: template, answers; else filler the
model never learned), to show where the drift sits.
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
from patch_effects import CONFIGS  # beside this file

from dsv4bisect.config.checkpoints import EMBEDDED_CHECKPOINT
from dsv4bisect.reference.engine import ReferenceEngine

CHUNK = 2048


def _logprobs(engine: ReferenceEngine, seqs: list[torch.Tensor]) -> list[torch.Tensor]:
    out = []
    with torch.inference_mode():
        for s in seqs:
            cache = engine.model.new_cache()
            hs = [engine.model.forward_hidden(s[i:i + CHUNK], cache)
                  for i in range(0, s.shape[0], CHUNK)]
            out.append(torch.log_softmax(engine.model.logits(torch.cat(hs)), -1))
    return out


def drift(base: list[torch.Tensor], other: list[torch.Tensor],
          seqs: list[torch.Tensor]) -> dict[str, float]:
    kl = torch.cat([(b.exp() * (b - o)).sum(-1)[:-1] for b, o in zip(base, other, strict=True)])
    top = torch.cat([(b.argmax(-1) == o.argmax(-1)).float()[:-1]
                     for b, o in zip(base, other, strict=True)])
    nll = torch.cat([-b[:-1].gather(1, s[1:, None])[:, 0] for b, s in zip(base, seqs, strict=True)])
    sure = nll < 0.5
    return {"kl_mean": float(kl.mean()), "kl_p99": float(kl.quantile(0.99)),
            "top1": float(top.mean()), "kl_mean_predictable": float(kl[sure].mean()),
            "kl_mean_rest": float(kl[~sure].mean()), "positions": int(kl.numel())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transcripts", type=Path, required=True, help="a run's drift.jsonl")
    ap.add_argument("--precisions", default="deployment,exact")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(1)
    seqs = [torch.tensor(json.loads(line)["input_ids"])
            for line in a.transcripts.read_text().splitlines() if line.strip()]
    results: list[dict[str, Any]] = []
    for precision in a.precisions.split(","):
        base: dict[str, list[torch.Tensor]] = {}
        for label, patch, variant, backend, also in CONFIGS:
            start = time.monotonic()
            if backend not in base:
                base[backend] = _logprobs(ReferenceEngine.load(
                    EMBEDDED_CHECKPOINT, moe_backend=backend, precision=precision,
                    device="cpu", threads=1), seqs)
            patches = {p: "" for p in also} | ({patch: variant} if patch else {})
            engine = ReferenceEngine.load(EMBEDDED_CHECKPOINT, patches=patches,
                                          moe_backend=backend, precision=precision,
                                          device="cpu", threads=1)
            r = {"label": label, "precision": precision, "patches": dict(engine.numerics.patches),
                 "moe_backend": backend,
                 **drift(base[backend], _logprobs(engine, seqs), seqs),
                 "seconds": round(time.monotonic() - start, 1)}
            results.append(r)
            print(f"| {precision} | {label} | {r['kl_mean']:.3g} | {r['top1']:.1%} | "
                  f"{r['kl_mean_predictable']:.3g} | {r['kl_mean_rest']:.3g} |", flush=True)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
