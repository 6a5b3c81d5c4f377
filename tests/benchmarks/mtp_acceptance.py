"""Greedy draft acceptance of a checkpoint's MTP layer on the probe's needle and copy answers.

    python tests/benchmarks/mtp_acceptance.py [--checkpoint DIR] [--lengths 512,1024]
        [--cases 1] [--tiers smoke,standard] [--precision exact|deployment] [--device cpu]

Loads the checkpoint with its MTP layer (`load_model(DIR, mtp=True)`), builds the probe's cases
of the tiers' needle and copy cells at `--lengths` (the probe's vocabulary, unseen in training)
and prints `training.eval.probe_acceptance`'s JSON: the share of drafted answer tokens where the
MTP layer's argmax equals the main model's greedy token (docs/training.md, "The MTP layer").
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from dsv4bisect.config.checkpoints import EMBEDDED_CHECKPOINT
from dsv4bisect.reference.checkpoint import load_model
from dsv4bisect.reference.config import Numerics
from dsv4bisect.reference.training.eval import probe_acceptance, probe_cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=str(EMBEDDED_CHECKPOINT))
    ap.add_argument("--lengths", default="512,1024")
    ap.add_argument("--cases", type=int, default=1, help="cases per probe cell")
    ap.add_argument("--tiers", default="smoke,standard")
    ap.add_argument("--precision", default="exact", choices=("exact", "deployment"))
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    if a.device == "cpu":
        torch.set_num_threads(1)
    model = load_model(a.checkpoint, a.device, mtp=True)
    model.configure(Numerics(precision=a.precision))
    cases = probe_cases(tuple(int(x) for x in a.lengths.split(",")), a.cases,
                        tiers=tuple(a.tiers.split(",")))
    start = time.monotonic()
    result = probe_acceptance(model, cases)
    print(json.dumps({"checkpoint": a.checkpoint, "precision": a.precision,
                      "lengths": a.lengths, "tiers": a.tiers, "cases_per_cell": a.cases,
                      **result, "seconds": round(time.monotonic() - start, 1)}, indent=2))


if __name__ == "__main__":
    main()
