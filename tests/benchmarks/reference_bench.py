"""Prefill and decode speed of the embedded DeepSeek-V4 engine (issue 3 target: an 8k-token
prompt prefills in <= 10 s on 2 CPU cores with the `tiny` preset).

    python tests/benchmarks/reference_bench.py                     # CPU, tiny random model
    python tests/benchmarks/reference_bench.py --threads 2 --lengths 512 2048 8192
    python tests/benchmarks/reference_bench.py --device cuda
    python tests/benchmarks/reference_bench.py --patches mma-decode:split-k,triton-indexer

Prefill tok/s = prompt tokens / time of `generate(prompt, max_new_tokens=1)` (the chunked
prefill plus one head). Decode tok/s = N / time of N greedy decode steps (one token through the
model with the KV cache, the head and the argmax: generate's loop, which runs on one CPU thread)
after a prompt of
`--decode-context` tokens (default: the longest length). Medians of `--repeat` runs after one
warm-up. Prints a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.patching.wire import parse_patch_set
from dsv4bisect.reference.engine import ReferenceEngine, single_thread


def _timed(engine: ReferenceEngine, ids: list[int], new: int) -> float:
    start = time.perf_counter()
    engine.generate(ids, max_new_tokens=new, stop_ids=())
    _sync(engine)
    return time.perf_counter() - start


def _median(engine: ReferenceEngine, ids: list[int], new: int, repeat: int) -> float:
    return statistics.median(_timed(engine, ids, new) for _ in range(repeat))


def _decode_seconds(engine: ReferenceEngine, ids: list[int], steps: int) -> float:
    """Time `steps` decode steps after prefilling `ids` (the loop of `generate`)."""
    with torch.inference_mode():
        cache = engine.model.new_cache()
        logits = engine.model.logits(engine._prefill(ids, cache)[-1:])
        _sync(engine)
        with single_thread():
            start = time.perf_counter()
            for _ in range(steps):
                logits = engine.decode_step(int(torch.argmax(logits[0])), cache)
            _sync(engine)
            return time.perf_counter() - start


def _sync(engine: ReferenceEngine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--checkpoint", default=None, help="checkpoint dir (default: random tiny)")
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: the engine's, 1 on CPU)",
    )
    p.add_argument("--chunk-size", type=int, default=2048)
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--decode-context", type=int, default=None, help="default: longest length")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--patches", default="", help="DSV4BISECT_PATCHES wire format")
    p.add_argument("--moe-backend", default="triton")
    args = p.parse_args()

    patches = parse_patch_set(args.patches, builtin_patches())
    longest = max(max(args.lengths), args.decode_context or 0) + args.decode_tokens
    engine = ReferenceEngine.load(
        args.checkpoint,
        patches=patches,
        moe_backend=args.moe_backend,
        chunk_size=args.chunk_size,
        device=args.device,
        threads=args.threads,
        max_model_len=longest,
    )
    vocab = engine.config.vocab_size
    gen = torch.Generator().manual_seed(0)

    def prompt(n: int) -> list[int]:
        return torch.randint(2, vocab, (n,), generator=gen).tolist()

    info = engine.info()
    print(
        f"device {info['device']} · threads {info['threads']} · torch {info['torch_version']} · "
        f"engine {info['engine_version']} · chunk {args.chunk_size} · patches "
        f"{args.patches or 'none'} · model {info['model']}\n"
    )
    print("| prompt tokens | prefill s | prefill tok/s |")
    print("| ---: | ---: | ---: |")
    _timed(engine, prompt(min(args.lengths)), 1)  # warm-up
    for n in args.lengths:
        t = _median(engine, prompt(n), 1, args.repeat)
        print(f"| {n} | {t:.3f} | {n / t:,.0f} |", flush=True)
    ctx = args.decode_context or max(args.lengths)
    ids = prompt(ctx)
    t = statistics.median(
        _decode_seconds(engine, ids, args.decode_tokens) for _ in range(args.repeat)
    )
    rate = args.decode_tokens / t
    print(
        f"\ndecode: {rate:,.1f} tok/s ({args.decode_tokens} tokens after a {ctx}-token prompt; "
        f"{1000 / rate:.1f} ms/token)"
    )


if __name__ == "__main__":
    main()
