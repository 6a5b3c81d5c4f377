"""Re-score every recorded probe answer (rows.jsonl under the given roots) with the current
scorer and list the `truncated` hard signatures with the configuration that gave them.

    python docs/results/2026-12-02-cpu-spec/truncated-signature-scan.py ROOT...

A row keeps `output`, `expected` and `finish_reason`; the values are the expected answer split
at ", " (the probe's multi-query join: no code or line contains it).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from dsv4bisect.probe.scoring import score


def bisect_end(rows_file: Path) -> str | None:
    """A bisect's end (`RUN/ends/bN/<end>/rows.jsonl`, no config.json): its patches from the
    run's `bisect.json` request."""
    end, run = rows_file.parent, rows_file.parent.parent.parent.parent
    try:
        req = json.loads((run / "bisect.json").read_text())["request"]
    except (OSError, ValueError, KeyError):
        return None
    patches = req.get("bad") if end.name == "bad" else req.get("good")
    wire = ",".join(f"{k}:{v}" for k, v in sorted((patches or {}).items()))
    return f"{req.get('profile', '?')} | bisect {end.name} end: {wire or 'no patches'}"


def configuration(rows_file: Path) -> str:
    cfg = rows_file.parent / "config.json"
    try:
        j = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return bisect_end(rows_file) or "unknown (no config.json: a test's or a saved probe's run)"
    wires = [p.get("env", {}).get("DSV4BISECT_PATCHES", "") for p in j.get("processes", [])]
    return f"{j.get('profile', '?')} | {';'.join(w for w in wires if w) or 'no patches'}"


def main(roots: list[str]) -> None:
    files = sorted(f for r in roots for f in Path(r).rglob("rows.jsonl"))
    per_config: Counter[str] = Counter()
    hits: Counter[str] = Counter()
    shown = []
    for f in files:
        config = configuration(f)
        for line in f.read_text().splitlines():
            r = json.loads(line) if line.strip() else {}
            if r.get("output") is None or "expected" not in r or r.get("arm") == "drift":
                continue
            per_config[config] += 1
            values = tuple(r["expected"].split(", "))
            s = score(r["output"], r["expected"], values, r.get("finish_reason"))
            if "truncated" in s.signatures:
                hits[config] += 1
                shown.append(f"  {f.parent.name}/{r['case_id']} {r['arm']} seed {r['seed']}: "
                             f"{r['output']!r} for {r['expected']!r} ({config})")
    print(f"{len(files)} rows.jsonl files, {sum(per_config.values())} answers, "
          f"{sum(hits.values())} truncated")
    print("answers (truncated) per configuration:")
    for config, n in per_config.most_common():
        print(f"  {n:5d} ({hits[config]}) {config}")
    print("truncated answers:")
    print("\n".join(shown))


if __name__ == "__main__":
    main(sys.argv[1:])
