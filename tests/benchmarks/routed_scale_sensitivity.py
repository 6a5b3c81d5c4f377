"""How far a checkpoint is from losing facts when the hash layers' routed experts are mis-scaled.

    python tests/benchmarks/routed_scale_sensitivity.py [--checkpoint DIR] \
        [--factors 1.5,2.25,3,4.5] [--layers hash|all] [--lengths 1024,2048,4096] \
        [--depths 0.1,0.5,0.9] [--cases 4] [--json OUT.json]

`hash-topk-scaling:double-scale` multiplies the routed output of the hash-routed layers by an
extra routed_scaling_factor (×1.5 on DeepSeek-V4-Flash). This script sweeps that extra factor:
for each factor it answers the probe's needle cases (the same cases, engine path and scorer as
`checkpoint_accuracy.py`) with the routed output of the chosen layers multiplied by it, the
shared expert untouched. Factor 1.5 is the fault itself; the larger ones say how much more
scale-sensitive a checkpoint would have to be for the fault to lose facts
(docs/reference-engine.md, docs/training.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import checkpoint_accuracy

from dsv4bisect.config.checkpoints import EMBEDDED_CHECKPOINT
from dsv4bisect.reference import model as reference_model

_STOCK_FORWARD = reference_model.MoE.forward


def scale_routed(factor: float, layers: str) -> None:
    """Make every MoE's routed output `factor` times larger (hash layers only unless `layers`
    is `all`). Patched on the class before the worker processes fork, so they inherit it."""

    def forward(self: Any, x: Any, step: Any) -> Any:
        out = _STOCK_FORWARD(self, x, step)  # routed + shared, [T, dim]
        if layers == "all" or self.gate.is_hash:
            sh = self.shared_experts
            shared = sh.w2(reference_model.swiglu(sh.w1(x), sh.w3(x), self.a.swiglu_limit))
            out = shared + factor * (out - shared)
        return out

    reference_model.MoE.forward = forward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=str(EMBEDDED_CHECKPOINT))
    ap.add_argument("--factors", default="1.5,2.25,3,4.5",
                    help="extra factors on the routed output (1 = stock, 1.5 = double-scale)")
    ap.add_argument("--layers", choices=("hash", "all"), default="hash")
    ap.add_argument("--lengths", default="1024,2048,4096")
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--cases", type=int, default=4, help="cases per length × depth cell")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", help="write every factor's full result here")
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for factor in map(float, a.factors.split(",")):
        scale_routed(factor, a.layers)
        r = checkpoint_accuracy.measure(
            {}, checkpoint=a.checkpoint, families=("needle",),
            lengths=tuple(map(int, a.lengths.split(","))),
            depths=tuple(map(float, a.depths.split(","))), cases=a.cases, workers=a.workers)
        acc = r["accuracy"]["needle"]
        rows.append({"factor": factor, "layers": a.layers, "seconds": r["seconds"],
                     "needle": {k: v for k, v in acc.items() if "/" not in k}, "result": r})
        print(f"×{factor:g} ({a.layers}): needle {acc['all']:.1%} " + " ".join(
            f"L{n}={acc[f'L{n}']:.0%}" for n in a.lengths.split(",")), file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"checkpoint": a.checkpoint, "rows": rows}, f, indent=1)
    print(json.dumps([{k: v for k, v in row.items() if k != "result"} for row in rows]))


if __name__ == "__main__":
    main()
