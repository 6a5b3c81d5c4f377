"""Decode tokens/s of the embedded engine with and without MTP speculative decoding.

    python tests/benchmarks/spec_bench.py [--checkpoint DIR] [--precision exact|deployment]
        [--lengths 512,1024] [--conversations 16] [--steps 3] [--max-new-tokens 96]

Runs the probe's needle and copy conversations (`training.eval.probe_cases`, smoke and standard
tiers) one at a time through the scheduler (`Generator`, no prefix cache) without speculation
and with `--speculative-algorithm NEXTN` at `--steps` (SGLang's DeepSeek default 3), and prints
JSON: per mode the decode tokens/s (output tokens after the first over the time after the first:
each conversation runs once for its first token alone, and that prefill time is subtracted),
`spec_accept_rate`, `avg_spec_accept_length`, main-model forwards per output token, and whether
the answers equal the non-speculative ones.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dsv4bisect.config.checkpoints import EMBEDDED_CHECKPOINT
from dsv4bisect.reference.chat import apply_chat_template
from dsv4bisect.reference.engine import ReferenceEngine
from dsv4bisect.reference.generation import Generator, GenSpec
from dsv4bisect.reference.spec_settings import SpecSettings
from dsv4bisect.reference.tokenizer import ByteTokenizer
from dsv4bisect.reference.training.eval import probe_cases

METRICS = ("spec_accept_rate", "avg_spec_accept_length", "main_forwards_per_output_token")


def run_mode(engine: ReferenceEngine, prompts: list[tuple[int, ...]], spec: SpecSettings | None,
             max_new: int) -> dict:
    tok = ByteTokenizer(engine.config.vocab_size)
    gen = Generator(engine, tok, radix_cache=False, spec=spec)
    decode_s, decode_tokens, answers = 0.0, 0, []
    try:
        for ids in prompts:
            start = time.perf_counter()
            gen.run(GenSpec(ids, 1))
            prefill = time.perf_counter() - start
            start = time.perf_counter()
            out = gen.run(GenSpec(ids, max_new))
            decode_s += time.perf_counter() - start - prefill
            decode_tokens += len(out.output_ids) - 1
            answers.append(out.output_ids)
        stats = gen.stats()
    finally:
        gen.scheduler.stop()
    return {"decode_tokens": decode_tokens, "decode_s": round(decode_s, 2),
            "decode_tokens_per_s": round(decode_tokens / max(decode_s, 1e-9), 2),
            **{k: stats[k] for k in METRICS}, "answers": answers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=str(EMBEDDED_CHECKPOINT))
    ap.add_argument("--precision", default="exact", choices=("exact", "deployment"))
    ap.add_argument("--lengths", default="512,1024")
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    a = ap.parse_args()
    engine = ReferenceEngine.load(a.checkpoint, precision=a.precision, device="cpu", mtp=True)
    cases = probe_cases(tuple(int(x) for x in a.lengths.split(",")), 1)[: a.conversations]
    prompts = [tuple(apply_chat_template(list(c.messages), True)) for c in cases]
    plain = run_mode(engine, prompts, None, a.max_new_tokens)
    spec = run_mode(engine, prompts, SpecSettings.resolve("NEXTN", a.steps), a.max_new_tokens)
    same = plain.pop("answers") == spec.pop("answers")
    print(json.dumps({"checkpoint": a.checkpoint, "precision": a.precision,
                      "conversations": len(prompts), "threads": torch.get_num_threads(),
                      "plain": plain, f"nextn_steps_{a.steps}": spec,
                      "speedup": round(spec["decode_tokens_per_s"]
                                       / max(plain["decode_tokens_per_s"], 1e-9), 3),
                      "same_answers": same}, indent=2))


if __name__ == "__main__":
    main()
