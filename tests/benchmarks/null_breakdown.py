"""Where a drift verdict's null model comes from: mean KL and top-1 disagreement per position
bucket, drift transcript and null arm (and the candidate's, given its run), against the
baseline's cold scores, position by position (`drift.compare`).

    python tests/benchmarks/null_breakdown.py BASELINE_RUN_DIR [CANDIDATE_RUN_DIR]

BASELINE_RUN_DIR is a probe run that holds `null.jsonl` (a fresh baseline: `probe --out DIR`
writes DIR/baseline). Used for docs/performance.md, "The null model's re-chunked arm".
"""

from __future__ import annotations

import sys
from collections import defaultdict

from dsv4bisect.probe.drift import DriftComparison, bucket_of, compare
from dsv4bisect.probe.run import ProbeRun


def main() -> None:
    base = ProbeRun.load(sys.argv[1])
    cand = ProbeRun.load(sys.argv[2]) if len(sys.argv) > 2 else None
    ref = base.drift_by_case()
    acc: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0])

    def add(arm: str, c: DriftComparison) -> None:
        for p, k, same in zip(c.positions, c.kl, c.top1_same, strict=True):
            for key in ((bucket_of(p), c.case_id, arm), (bucket_of(p), "*", arm),
                        ("all", "*", arm)):
                a = acc[key]
                a[0], a[1], a[2] = a[0] + 1, a[1] + k, a[2] + (not same)

    for arm, rec in base.null:
        add(arm, compare(ref[rec.case_id], rec))
    for rec in cand.drift if cand else ():
        add("candidate", compare(ref[rec.case_id], rec))
    order = {b: i for i, b in enumerate(sorted({k[0] for k in acc if k[0] != "all"},
                                               key=lambda b: int(b.split("-")[0].rstrip("+"))))}
    print("| bucket | transcript | arm | positions | mean KL | top-1 differs |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for key in sorted(acc, key=lambda k: (order.get(k[0], len(order)), k[1], k[2])):
        n, kl, differ = acc[key]
        print(f"| {key[0]} | {key[1]} | {key[2]} | {n} | {kl / n:.3g} | {differ / n:.2%} |")


if __name__ == "__main__":
    main()
