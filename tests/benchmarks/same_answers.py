"""Whether two `dsv4bisect run` directories answered every probe request alike.

    python tests/benchmarks/same_answers.py RUN_DIR_A RUN_DIR_B

For the baseline and the candidate of each: the requests both ran (same case, arm and
concurrency level), how many answers are the same text, how many each got right, and the first
that differ; then the largest difference of a teacher-forced log-prob between the two
baselines' drift transcripts. Used to show `reference-pd` answers as `reference` does at
`precision: exact` (docs/performance.md, "PD disaggregation").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _rows(run: Path, arm: str) -> dict[tuple, dict]:
    out = {}
    for line in (run / arm / "rows.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("output") is not None:
            out[(row["case_id"], row["arm"], row.get("concurrency"))] = row
    return out


def _drift(run: Path) -> dict[str, dict]:
    lines = (run / "baseline" / "drift.jsonl").read_text().splitlines()
    return {(rec := json.loads(line))["case_id"]: rec for line in lines}


def main(a: Path, b: Path) -> None:
    for arm in ("baseline", "candidate"):
        ra, rb = _rows(a, arm), _rows(b, arm)
        keys = sorted(set(ra) & set(rb))
        differ = [k for k in keys if ra[k]["output"] != rb[k]["output"]]
        right = [sum(bool(r[k]["correct"]) for k in keys) for r in (ra, rb)]
        print(f"{arm}: {len(keys)} paired answers, {len(keys) - len(differ)} identical, "
              f"right {right[0]} / {right[1]}; first that differ: {differ[:5]}")
    da, db = _drift(a), _drift(b)
    gap = max((abs(x - y) for c in da.keys() & db.keys()
               for x, y in zip(da[c]["token_logprobs"], db[c]["token_logprobs"])), default=0.0)
    print(f"drift transcripts: {len(da.keys() & db.keys())}, largest log-prob difference {gap}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
