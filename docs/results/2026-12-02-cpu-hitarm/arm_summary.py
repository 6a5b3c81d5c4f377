"""Per condition (arm@level) of a `dsv4bisect run` directory: paired requests, answers the
candidate lost and gained against the baseline, how many scored requests the server served
whole from its prefix cache (usage cached_tokens == prompt_tokens) or in part, and the summed
request latency of the baseline and the candidate.

    python docs/results/2026-12-02-cpu-hitarm/arm_summary.py RUN_DIR
"""

import collections
import json
import sys
from pathlib import Path


def rows(path: Path) -> dict:
    out = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        out[(r["case_id"], r["arm"], r["concurrency"])] = r
    return out


run = Path(sys.argv[1])
base, cand = rows(run / "baseline" / "rows.jsonl"), rows(run / "candidate" / "rows.jsonl")
stats = collections.defaultdict(collections.Counter)
for key, b in base.items():
    c = cand.get(key)
    if c is None or b["family"] == "drift":
        continue
    s = stats[f"{key[1]}@{key[2]}"]
    s["n"] += 1
    s["lost"] += bool(b["correct"]) and not c["correct"]
    s["gained"] += (not b["correct"]) and bool(c["correct"])
    for who, r in (("base", b), ("cand", c)):
        cached = r.get("cached_tokens")
        s[f"{who}_whole_hits"] += cached is not None and cached == r["prompt_tokens"]
        s[f"{who}_part_hits"] += cached is not None and 0 < cached < r["prompt_tokens"]
        s[f"{who}_latency_ms"] += round(1000 * r["latency_s"])
print("condition  n  lost gained  whole-prompt hits (base/cand)  partial hits (base/cand)  "
      "latency s (base/cand)")
for cond, s in sorted(stats.items()):
    print(f"{cond:9} {s['n']:3} {s['lost']:5} {s['gained']:6}  {s['base_whole_hits']:>13}/"
          f"{s['cand_whole_hits']:<16} {s['base_part_hits']:>11}/{s['cand_part_hits']:<12} "
          f"{s['base_latency_ms'] / 1000:8.1f}/{s['cand_latency_ms'] / 1000:.1f}")
