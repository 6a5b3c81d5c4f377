"""What each patch does to the shipped checkpoint: retrieval by length and drift, per variant.

    python tests/benchmarks/patch_effects.py [--cases 4] [--precision deployment|exact] \
        [--out docs/results/DIR]

For every real patch (default variant), the other non-fault variants and every fault variant:
`checkpoint_accuracy.py`'s measurement (the probe's needle and copy cases, `--cases` per length ×
depth cell, lengths 512–4096) and one `dsv4bisect run reference --only ... --json` (smoke tier,
against the cached all-off baseline) for the drift figures and the verdict. Prints the markdown
table of docs/reference-engine.md on stdout; `--out` keeps every result as JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoint_accuracy as ca  # beside this file

TRTLLM = ("flashinfer_trtllm", ("nvfp4-dispatch",))  # the backend and patch the clamp needs
# (label, patch, variant, moe backend, patches also on)
CONFIGS: list[tuple[str, str | None, str | None, str, tuple[str, ...]]] = [
    ("all off", None, None, "triton", ()),
    ("mhc-bf16", "mhc-bf16", "bf16", "triton", ()),
    ("hash-topk-scaling", "hash-topk-scaling", "topk", "triton", ()),
    ("mma-decode", "mma-decode", "split-k", "triton", ()),
    ("mma-decode (split-k-fp32)", "mma-decode", "split-k-fp32", "triton", ()),
    ("triton-indexer", "triton-indexer", "bf16", "triton", ()),
    ("triton-indexer (fp32)", "triton-indexer", "fp32", "triton", ()),
    ("nvfp4-dispatch", "nvfp4-dispatch", "hybrid", "triton", ()),
    ("nvfp4-dispatch (weights-only)", "nvfp4-dispatch", "weights-only", "triton", ()),
    ("trtllm-clamp (+ nvfp4, TRT-LLM runner)", "trtllm-clamp", "alpha", *TRTLLM),
    ("**fault** hash-topk-scaling double-scale", "hash-topk-scaling", "double-scale", "triton",
     ()),
    ("**fault** mma-decode merge-no-rescale", "mma-decode", "merge-no-rescale", "triton", ()),
    ("**fault** trtllm-clamp ignore-alpha (+ nvfp4, TRT-LLM runner)", "trtllm-clamp",
     "ignore-alpha", *TRTLLM),
]
LENGTHS = (512, 1024, 2048, 4096)


def run_cli(patch: str | None, variant: str | None, backend: str,
            also: tuple[str, ...], precision: str = "deployment") -> dict[str, Any]:
    """`dsv4bisect run reference` with exactly this patch set; the verdict JSON."""
    cmd = ["dsv4bisect", "run", "reference", "--json"]
    if precision != "deployment":
        cmd += ["--set", f"engine.precision={precision}"]
    if patch:
        cmd += ["--only", ",".join((*also, patch)), "--set", f"patches.{patch}.variant={variant}"]
    if backend != "triton":
        cmd += ["--set", f"engine.moe_backend={backend}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    verdict = json.loads(proc.stdout)
    return {"command": " ".join(cmd), "exit_code": proc.returncode, "verdict": verdict}


def measure(label: str, patch: str | None, variant: str | None, backend: str,
            also: tuple[str, ...], cases: int, precision: str = "deployment") -> dict[str, Any]:
    specs = [*also, f"{patch}={variant}"] if patch else []
    acc = ca.measure(ca.parse_patches(specs), moe_backend=backend, precision=precision,
                     lengths=LENGTHS, depths=(0.1, 0.5, 0.9), cases=cases, seed=1)
    acc.pop("cases")
    return {"label": label, "accuracy": acc,
            "run": run_cli(patch, variant, backend, also, precision)}


def row(r: dict[str, Any]) -> str:
    """needle / copy accuracy per length, then the smoke run's drift, lost answers, verdict."""
    acc = r["accuracy"]["accuracy"]
    cells = [f"{acc['needle'][f'L{n}']:.0%} / {acc['copy'][f'L{n}']:.0%}" for n in LENGTHS]
    v = r["run"]["verdict"]
    drift = v.get("drift", {}).get("candidate") or {}
    overall = v.get("overall", {})
    kl = f"{drift['kl_mean']:.3g}" if "kl_mean" in drift else "-"
    top1 = f"{drift['top1_agreement']:.1%}" if "top1_agreement" in drift else "-"
    lost = f"{overall.get('b', '-')}/{overall.get('baseline_right', '-')}"
    return f"| {r['label']} | " + " | ".join([*cells, kl, top1, lost, v["verdict"]]) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=4, help="cases per length × depth cell")
    ap.add_argument("--out", type=Path, help="directory for one JSON per configuration")
    ap.add_argument("--only", help="labels containing this text")
    ap.add_argument("--precision", default="deployment", choices=("deployment", "exact"))
    args = ap.parse_args()
    header = ("| patch (variant) | " + " | ".join(f"{n}" for n in LENGTHS)
              + " | drift mean KL | top-1 agreement | answers lost (smoke) | `run` verdict |")
    print(header + "\n|" + " --- |" * (len(LENGTHS) + 5), flush=True)
    for label, patch, variant, backend, also in CONFIGS:
        if args.only and args.only not in label:
            continue
        r = measure(label, patch, variant, backend, also, args.cases, args.precision)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            name = (patch or "off") + (f"-{variant}" if variant else "")
            (args.out / f"{name}.json").write_text(json.dumps(r, indent=1) + "\n")
        print(row(r), flush=True)


if __name__ == "__main__":
    main()
