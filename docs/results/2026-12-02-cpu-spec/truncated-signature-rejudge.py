"""Judge a saved run's answers again with the current scorer (no server is started): the
verdict a run or a bisect end collected before the `truncated` signature existed would get now,
and every answer the candidate lost, with its signatures.

    python docs/results/2026-12-02-cpu-spec/truncated-signature-rejudge.py DIR [CANDIDATE]

DIR holds `baseline/`, `baseline-repeat/` and the candidate's directory (`candidate`, the
default, in a run directory; `bad` in a bisect's `ends/b0`).
"""

from __future__ import annotations

import dataclasses
import json
import sys

from dsv4bisect.probe.run import ProbeRun, row_key
from dsv4bisect.probe.runner import judge
from dsv4bisect.probe.scoring import score


def rescored(run: ProbeRun) -> ProbeRun:
    rows = []
    for r in run.rows:
        if r.get("output") is not None and "expected" in r:
            case = run.case(r["case_id"])
            s = score(r["output"], case.expected, case.values, r.get("finish_reason"))
            r = {**r, "signatures": list(s.signatures)}
        rows.append(r)
    return dataclasses.replace(run, rows=tuple(rows))


def main(directory: str, candidate: str = "candidate") -> None:
    base, rep, cand = (rescored(ProbeRun.load(f"{directory}/{x}"))
                       for x in ("baseline", "baseline-repeat", candidate))
    v = judge(base, rep, cand)
    print(v.verdict)
    for reason in v.reasons[:4]:
        print(" -", reason)
    print("signatures:", json.dumps(v.signatures))
    right = {row_key(r): r for r in base.rows if r.get("correct")}
    answers = [r for r in cand.rows if r.get("output") is not None and "expected" in r]
    lost = [r for r in answers if row_key(r) in right and not r["correct"]]
    for r in lost:
        print(f"lost {r['case_id']} {r['arm']}@{r.get('concurrency', 1)} seed {r['seed']}: "
              f"{r['output']!r} for {r['expected']!r}, finish {r.get('finish_reason')}, "
              f"signatures {r['signatures']}")
    cut = sum("truncated" in r["signatures"] for r in answers)
    print(f"{len(answers)} answers, {cut} truncated, {len(lost)} lost where the baseline was "
          f"right, {sum('truncated' in r['signatures'] for r in lost)} of them truncated")


if __name__ == "__main__":
    main(*sys.argv[1:])
