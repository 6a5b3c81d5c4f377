"""Retrieval accuracy of the embedded checkpoint on the probe's own cases, per length × depth.

    python tests/benchmarks/checkpoint_accuracy.py [--patch NAME[=VARIANT] ...] \
        [--moe-backend triton] [--precision deployment|exact] [--lengths 512,1024,2048,4096] \
        [--depths 0.1,0.25,0.5,0.75,0.9] [--cases 20] [--families needle,copy] \
        [--workers 2] [--json OUT.json]

The acceptance measurement of the shipped checkpoint (issue 7, docs/reference-engine.md): the
probe's case generator (`probe.grid.build_cases`, probe vocabulary, jitter, layout at exact
token lengths) with more cases per cell than any tier, answered by the embedded engine in this
process's workers (`ReferenceEngine.generate`, greedy, the same path `dsv4bisect serve` runs) and
scored by the probe's scorer (`correct`, the probe's criterion; `exact` beside it). No server,
so thousands of cases fit in minutes on two CPU cores. Prints a table per family on stderr and, with `--json`, every case's result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from dsv4bisect.config.checkpoints import EMBEDDED_CHECKPOINT
from dsv4bisect.probe.grid import Case, build_cases
from dsv4bisect.probe.layout import calibrate
from dsv4bisect.probe.scoring import score
from dsv4bisect.probe.spec import tier_spec
from dsv4bisect.probe.vocab import PROBE_VOCAB
from dsv4bisect.reference.chat import apply_chat_template
from dsv4bisect.reference.tokenizer import ByteTokenizer

_TOK = ByteTokenizer()
_ENGINE: Any = None


def _count(messages: list[dict[str, str]]) -> int:
    return len(apply_chat_template(messages, True))


def _load(checkpoint: str, patches: dict[str, str], backend: str, precision: str) -> None:
    global _ENGINE
    from dsv4bisect.reference.engine import ReferenceEngine

    _ENGINE = ReferenceEngine.load(checkpoint, patches=patches, moe_backend=backend,
                                   precision=precision, device="cpu", threads=1,
                                   max_model_len=8192)


def _answer(case: dict[str, Any]) -> dict[str, Any]:
    c = Case.from_dict(case)
    prompt = apply_chat_template(list(c.messages), True)
    gen = _ENGINE.generate(prompt, max_new_tokens=c.max_tokens)
    text = _TOK.decode([t for t in gen.output_ids if t != _ENGINE.config.eos_token_id])
    s = score(text, c.expected, c.values, gen.finish_reason)
    return {"case_id": c.case_id, "family": c.family, "length": c.cell.length,
            "depth": c.cell.depth, "prompt_tokens": c.prompt_tokens, "expected": c.expected,
            "output": text, "exact": s.exact, "correct": s.correct}


def parse_patches(specs: list[str]) -> dict[str, str]:
    """`--patch NAME` (default variant) or `--patch NAME=VARIANT`."""
    from dsv4bisect.patching.registry import builtin_patches

    known = builtin_patches()
    out = {}
    for spec in specs:
        name, _, variant = spec.partition("=")
        out[name] = variant or known[name].default_variant
    return out


def measure(patches: dict[str, str], *, checkpoint: str = str(EMBEDDED_CHECKPOINT),
            moe_backend: str = "triton", precision: str = "deployment", families: tuple[str, ...] = ("needle", "copy"),
            lengths: tuple[int, ...] = (512, 1024, 2048, 4096),
            depths: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9), cases: int = 20,
            seed: int = 0, ratios: tuple[int, ...] = (4, 16), workers: int = 2) -> dict[str, Any]:
    """Answer the probe's cases of `families` × `lengths` × `depths` (`cases` each) with the
    engine under `patches` (name -> variant); accuracy per family and cell, every case."""
    spec = tier_spec("smoke").replace(families=families, lengths=lengths, depths=depths,
                                      cases_per_cell=cases, seed=seed)
    cases_ = build_cases(spec, PROBE_VOCAB, _count, calibrate(_count, PROBE_VOCAB), ratios)
    start = time.monotonic()
    # Longest first so the two workers finish together.
    todo = sorted((c.to_dict() for c in cases_), key=lambda d: -d["prompt_tokens"])
    with ProcessPoolExecutor(workers, initializer=_load,
                             initargs=(checkpoint, patches, moe_backend, precision)) as pool:
        results = list(pool.map(_answer, todo, chunksize=4))
    # [correct, exact, n] per family and cell; `correct` is the probe's criterion
    table: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))
    for r in results:
        for key in (f"L{r['length']}/d{r['depth']:g}", f"L{r['length']}", "all"):
            table[r["family"]][key][0] += r["correct"]
            table[r["family"]][key][1] += r["exact"]
            table[r["family"]][key][2] += 1
    return {"patches": patches, "moe_backend": moe_backend, "precision": precision,
            "checkpoint": checkpoint,
            "spec": {"lengths": spec.lengths, "depths": spec.depths, "cases": cases,
                     "seed": seed, "distractors": spec.distractors,
                     "copy_chars": spec.copy_chars, "turns": spec.turns},
            "seconds": round(time.monotonic() - start, 1),
            "accuracy": {fam: {k: round(v[0] / v[2], 4) for k, v in cells.items()}
                         for fam, cells in table.items()},
            "exact": {fam: {k: round(v[1] / v[2], 4) for k, v in cells.items()}
                      for fam, cells in table.items()},
            "counts": {fam: dict(cells) for fam, cells in table.items()},
            "cases": results}


def render(result: dict[str, Any]) -> str:
    lines = [(f"patches: {result['patches'] or 'none'} · moe_backend {result['moe_backend']} · "
              f"precision {result.get('precision', 'exact')} · "
              f"{result['spec']['cases']} cases per cell · {result['seconds']} s")]
    lengths, depths = result["spec"]["lengths"], result["spec"]["depths"]
    for fam, acc in result["accuracy"].items():
        lines.append(f"\n{fam}: overall {acc['all']:.1%} correct "
                     f"({result['exact'][fam]['all']:.1%} exact)")
        lines.append("| length | " + " | ".join(f"d{d:g}" for d in depths) + " | all |")
        lines.append("| ---: |" + " ---: |" * (len(depths) + 1))
        for n in lengths:
            row = [f"{acc[f'L{n}/d{d:g}']:.0%}" for d in depths]
            lines.append(f"| {n} | " + " | ".join(row) + f" | {acc[f'L{n}']:.1%} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=str(EMBEDDED_CHECKPOINT))
    ap.add_argument("--patch", action="append", default=[], help="NAME or NAME=VARIANT")
    ap.add_argument("--moe-backend", default="triton")
    ap.add_argument("--precision", default="deployment", choices=("deployment", "exact"))
    ap.add_argument("--families", default="needle,copy")
    ap.add_argument("--lengths", default="512,1024,2048,4096")
    ap.add_argument("--depths", default="0.1,0.25,0.5,0.75,0.9")
    ap.add_argument("--cases", type=int, default=20, help="cases per length × depth cell")
    ap.add_argument("--seed", type=int, default=0, help="probe seed (the tiers use 0)")
    ap.add_argument("--ratios", type=lambda s: tuple(map(int, s.split(","))), default=(4, 16),
                    help="compress ratios for the jitter (the embedded model's)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--json", help="write the full result (every case) here")
    a = ap.parse_args()
    result = measure(parse_patches(a.patch), checkpoint=a.checkpoint, moe_backend=a.moe_backend,
                     precision=a.precision, families=tuple(a.families.split(",")),
                     lengths=tuple(map(int, a.lengths.split(","))),
                     depths=tuple(map(float, a.depths.split(","))), cases=a.cases, seed=a.seed,
                     ratios=a.ratios, workers=a.workers)
    print(render(result), file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("patches", "moe_backend", "precision", "seconds",
                                             "accuracy")}))


if __name__ == "__main__":
    main()
