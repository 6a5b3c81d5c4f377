"""Plot training runs' loss curves from their log.jsonl files (docs/training.md).

    python tests/benchmarks/plot_training.py OUT.png NAME=LOG.jsonl [NAME=LOG.jsonl ...]

Two panels per run set: the answer cross-entropy of the training batches (every 10th step),
and the held-out exact retrieval of the current curriculum stage's task (every 100th step),
with the stage changes marked; for an MTP-only run (`mtp_main`) the held-out draft acceptance
instead. Needs matplotlib (the `plots` extra).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen


def main() -> None:
    out, runs = Path(sys.argv[1]), [a.partition("=") for a in sys.argv[2:]]
    fig, (ce_ax, ex_ax) = plt.subplots(1, 2, figsize=(11, 4))
    key = "eval_exact"
    for name, _, path in runs:
        recs = [json.loads(line) for line in Path(path).read_text().splitlines()]
        key = "eval_exact" if any("eval_exact" in r for r in recs) else "eval_accept"
        line, = ce_ax.plot([r["step"] for r in recs], [r["answer_ce"] for r in recs],
                           lw=0.8, label=name)
        evals = [r for r in recs if key in r]
        ex_ax.plot([r["step"] for r in evals], [r[key] for r in evals],
                   color=line.get_color(), marker=".", label=name)
        for r in recs:
            if "stage_done" in r:
                ex_ax.axvline(r["step"], color=line.get_color(), ls=":", lw=0.8)
    ce_ax.set(yscale="log", xlabel="step", ylabel="answer CE (nats/token)",
              title="training batches")
    mtp = key == "eval_accept"
    ex_ax.set(xlabel="step", ylabel="draft acceptance" if mtp else "exact", ylim=(0, 1),
              title="held-out draft acceptance on answers" if mtp
              else "held-out exact retrieval (dotted: next stage)")
    for ax in (ce_ax, ex_ax):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
