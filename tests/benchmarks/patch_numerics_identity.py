"""Record, per patch and variant, what the embedded engine computes, to show that a refactor of
the patch code leaves every number where it was (docs/patches.md, "Numerics are fixed").

For every registered patch and variant (the canary pair too, and the patch combinations where
one patch's swap takes the op another one would take), at `precision: deployment` and `exact`:
- teacher-forced scoring (`ReferenceEngine.score`, top 8) of one fixed prompt of 900 tokens in
  chunks of 256: past the sliding window (16), into the HCA layers' split-K range (more than 64
  keys: 48 compressed entries of ratio 16 plus the window) and every CSA residue, with a digest
  of every logit row the model produced;
- a greedy generation (`ReferenceEngine.generate`, 850 prompt tokens + 12 new: decode steps
  over split-K key lists);
- the server's path (`serving.build_api`, its `Generator`): three requests batched together
  (ragged prefill and decode batches: batch-kv-slot, scale-layout), then one at a time a
  prefix-cache hit and a whole-prompt retry (swa-ring-stale), a sampled request with a seed
  (greedy-verify), requests with many stop ids (draft-eos), with speculative decoding where the
  patch set turns it on.

The batch is made deterministic by queueing its requests while the scheduler is drained
(`Generator.drained`, which also empties the prefix cache), in a fixed order, so each run forms
the same batches; the later requests run one after the other.

Usage (one tree per interpreter: the venv whose install is the tree to measure):
    python tests/benchmarks/patch_numerics_identity.py record OUT.json [--only NAME ...]
    python tests/benchmarks/patch_numerics_identity.py compare A.json B.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ["DSV4BISECT_TEST_PATCHES"] = "1"  # the canary pair is a patch set too

PROMPT_SCORE, PROMPT_GEN, NEW_TOKENS, CHUNK = 900, 850, 12, 256
PRECISIONS = ("deployment", "exact")
# Sets where one patch's embedded numerics decide an op another would take (the first in
# registry order wins there), and the backends two patches act under.
COMBINATIONS: list[tuple[dict[str, str], str]] = [
    ({"mhc-bf16": "bf16", "flashinfer-mhc": "tf32"}, "triton"),
    ({"fused-mhc-post-pre": "fused", "flashinfer-mhc": "tf32"}, "triton"),
    ({"mma-decode": "split-k-fp32", "sm120-flashmla-backend": "flashinfer"}, "triton"),
    ({"mma-decode": "batch-kv-slot", "sm120-flashmla-backend": "triton"}, "triton"),
    ({"triton-indexer": "fp32", "tilelang-indexer": "tilelang"}, "triton"),
    ({"triton-indexer": "residue", "tilelang-indexer": "tilelang"}, "triton"),
    ({"canary-a": "on", "canary-b": "on"}, "triton"),
    ({"nvfp4-dispatch": "hybrid", "trtllm-clamp": "alpha"}, "flashinfer_trtllm"),
    ({"nvfp4-dispatch": "weights-only", "trtllm-clamp": "ignore-alpha"}, "flashinfer_trtllm"),
    ({"trtllm-clamp": "ignore-alpha"}, "flashinfer_trtllm"),
    ({"trtllm-clamp": "alpha"}, "flashinfer_trtllm"),
    ({"nvfp4-dispatch": "hybrid"}, "marlin"),
    ({"nvfp4-dispatch": "weights-only"}, "flashinfer_trtllm"),
    ({"hash-topk-scaling": "double-scale", "fp8-wo-a-gemm": "scale-layout"}, "triton"),
]


def tokens(n: int, seed: int, vocab: int) -> list[int]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab, (n,), generator=g).tolist()


def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def cases() -> list[tuple[str, dict[str, str], str]]:
    from dsv4bisect.patching.registry import builtin_patches

    out = [("stock", {}, "triton")]
    for name, patch in builtin_patches().items():
        for v in patch.variants:
            out.append((f"{name}:{v.name}", {name: v.name}, "triton"))
    for patches, backend in COMBINATIONS:
        label = "+".join(f"{k}:{v}" for k, v in patches.items())
        out.append((f"{label}@{backend}", patches, backend))
    return out


def engine_path(patches: dict[str, str], backend: str, precision: str) -> dict[str, Any]:
    """Scoring and greedy generation through `ReferenceEngine`, with a digest of every logit
    row the model produced on the way."""
    import torch

    from dsv4bisect.reference.engine import ReferenceEngine

    engine = ReferenceEngine.load(None, patches=patches, moe_backend=backend,
                                  precision=precision, chunk_size=CHUNK, device="cpu")
    rows = hashlib.sha256()
    logits = engine.model.logits

    def recorded(h: torch.Tensor) -> torch.Tensor:
        out = logits(h)
        rows.update(out.detach().contiguous().numpy().tobytes())
        return out

    engine.model.logits = recorded  # type: ignore[method-assign]
    vocab = engine.config.vocab_size
    scores = engine.score(tokens(PROMPT_SCORE, 1, vocab), start=1, top_logprobs=8)
    score_rows = rows.hexdigest()[:20]
    gen = engine.generate(tokens(PROMPT_GEN, 2, vocab), max_new_tokens=NEW_TOKENS,
                          stop_ids=[], top_logprobs=4)
    return {
        "score": digest([[s.position, s.token_id, s.logprob, s.top] for s in scores]),
        "score_logits": score_rows,
        "generate": digest([gen.output_ids, gen.logprobs, gen.top_logprobs, gen.finish_reason]),
        "generate_ids": gen.output_ids,
        "all_logits": rows.hexdigest()[:20],
    }


def server_path(patches: dict[str, str], backend: str, precision: str) -> dict[str, Any]:
    """The scheduler's batches, prefix cache and speculative decoding (`Generator`)."""
    from dsv4bisect.reference.generation import GenSpec
    from dsv4bisect.reference.serving import ServeOptions, build_api

    api = build_api(ServeOptions(patches=patches, moe_backend=backend, precision=precision,
                                 chunk_size=CHUNK, device="cpu", max_running_requests=8),
                    port=0)
    gen = api.gen
    vocab = gen.engine.config.vocab_size
    a, b, c = tokens(120, 3, vocab), tokens(97, 4, vocab), tokens(133, 5, vocab)
    batched = [
        GenSpec(tuple(a), 10, return_logprob=True, logprob_start_len=0, top_logprobs_num=3,
                ignore_eos=True),
        GenSpec(tuple(b), 10, top_logprobs_num=3, ignore_eos=True),
        GenSpec(tuple(c), 10, temperature=0.8, seed=7, ignore_eos=True),
    ]
    later = [  # one at a time, on what the batch left in the prefix cache
        GenSpec(tuple(a + tokens(20, 6, vocab)), 8, ignore_eos=True),  # a prefix hit
        GenSpec(tuple(b), 10, top_logprobs_num=3, ignore_eos=True),  # the whole prompt again
        GenSpec(tuple(c), 24, stop_token_ids=tuple(range(2, vocab, 2))),  # many stop ids
        GenSpec(tuple(tokens(60, 7, vocab)), 24, stop_token_ids=tuple(range(3, vocab, 3))),
    ]
    out = run_together(gen, batched) + [gen.run(spec) for spec in later]
    stats = gen.stats()
    return {
        "outputs": digest([[o.output_ids, o.output_logprobs, o.output_top, o.input_logprobs,
                            o.input_top, o.cached_tokens, o.finish_reason] for o in out]),
        "output_ids": [o.output_ids for o in out],
        "cached": [o.cached_tokens for o in out],
        "batches": [stats.get("prefill_batches"), stats.get("decode_batches"),
                    stats.get("spec_verify_forwards")],
    }


def run_together(gen: Any, specs: list[Any]) -> list[Any]:
    """Queue every spec, in order, while the scheduler is drained, then let them run: the
    scheduler admits them in that order into the same batches on every run."""
    results: list[Any] = [None] * len(specs)
    threads = []
    sched = gen.scheduler
    with gen.drained():
        for i, spec in enumerate(specs):
            before = len(sched._waiting)

            def work(i: int = i, spec: Any = spec) -> None:
                results[i] = gen.run(spec)

            t = threading.Thread(target=work)
            t.start()
            threads.append(t)
            while len(sched._waiting) == before:
                time.sleep(0.001)
    for t in threads:
        t.join()
    return results


def record(out: Path, only: list[str]) -> None:
    import torch

    torch.set_num_threads(1)
    result: dict[str, Any] = {"tree": str(Path(__import__("dsv4bisect").__file__).parent)}
    for label, patches, backend in cases():
        if only and not any(o in label for o in only):
            continue
        for precision in PRECISIONS:
            key = f"{label}/{precision}"
            t0 = time.time()
            result[key] = {"engine": engine_path(patches, backend, precision),
                           "server": server_path(patches, backend, precision)}
            print(f"{key}: {time.time() - t0:.1f}s", file=sys.stderr, flush=True)
            out.write_text(json.dumps(result, indent=1))


def compare(a: Path, b: Path) -> int:
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    keys = [k for k in x if k != "tree"]
    same = [k for k in keys if x[k] == y.get(k)]
    differ = [k for k in keys if k in y and x[k] != y[k]]
    missing = sorted((set(keys) ^ {k for k in y if k != "tree"}))
    print(f"{x['tree']} vs {y['tree']}: {len(same)} of {len(keys)} cases bit-identical")
    for k in differ:
        print(f"DIFFERENT {k}: {x[k]} vs {y[k]}")
    for k in missing:
        print(f"MISSING in one file: {k}")
    return 0 if not differ and not missing else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out", type=Path)
    r.add_argument("--only", nargs="*", default=[])
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = p.parse_args()
    if args.cmd == "record":
        record(args.out, args.only)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    raise SystemExit(main())
