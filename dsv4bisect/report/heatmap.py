"""Accuracy heatmaps: length × depth for the baseline, the candidate and their difference.

One row of panels per accuracy family present in the rows (arms and turn counts pooled per
cell). matplotlib is optional (`pip install dsv4bisect[plots]`) and imported only when a plot is
drawn; without it `render_heatmap` returns None and the caller says `PLOTS_SKIPPED`.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PLOTS_SKIPPED = "plots skipped: matplotlib is not installed (pip install 'dsv4bisect[plots]')"
ACCURACY_FAMILIES = ("needle", "copy", "vartrack")

Grid = dict[tuple[int, float], float]  # (length, depth) -> accuracy


def accuracy_grid(rows: Iterable[dict[str, Any]], family: str) -> Grid:
    """Mean correctness per (length, depth) for one family's rows."""
    sums: dict[tuple[int, float], list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        if r.get("family") != family or r.get("correct") is None:
            continue
        acc = sums[(int(r["length"]), float(r["depth"]))]
        acc[0] += bool(r["correct"])
        acc[1] += 1
    return {k: v[0] / v[1] for k, v in sums.items()}


def _matrix(grid: Grid, lengths: list[int], depths: list[float]) -> list[list[float]]:
    nan = float("nan")
    return [[grid.get((n, d), nan) for n in lengths] for d in depths]


def render_heatmap(baseline_rows: Iterable[dict[str, Any]],
                   candidate_rows: Iterable[dict[str, Any]],
                   path: str | os.PathLike[str], *, title: str | None = None) -> Path | None:
    """Write the PNG; None when matplotlib is missing or there is nothing to plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never open a window
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    base, cand = list(baseline_rows), list(candidate_rows)
    families = [f for f in ACCURACY_FAMILIES if accuracy_grid(base, f)]
    if not families:
        return None
    fig, axes = plt.subplots(len(families), 3, figsize=(12, 3.2 * len(families)), squeeze=False)
    for row, fam in enumerate(families):
        b, c = accuracy_grid(base, fam), accuracy_grid(cand, fam)
        lengths = sorted({k[0] for k in b} | {k[0] for k in c})
        depths = sorted({k[1] for k in b} | {k[1] for k in c})
        diff = {k: c[k] - b[k] for k in b if k in c}
        panels = ((b, "baseline", "viridis", 0.0, 1.0), (c, "candidate", "viridis", 0.0, 1.0),
                  (diff, "candidate − baseline", "RdBu", -1.0, 1.0))
        for col, (grid, name, cmap, lo, hi) in enumerate(panels):
            _panel(axes[row][col], _matrix(grid, lengths, depths), lengths, depths,
                   f"{fam}: {name}", cmap, lo, hi)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _panel(ax: Any, matrix: list[list[float]], lengths: list[int], depths: list[float],
           title: str, cmap: str, lo: float, hi: float) -> None:
    image = ax.imshow(matrix, cmap=cmap, vmin=lo, vmax=hi, aspect="auto", origin="lower")
    ax.set_title(title, fontsize=10)
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=8)
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=8)
    ax.set_xlabel("prompt length (tokens)", fontsize=8)
    ax.set_ylabel("needle depth", fontsize=8)
    for y, line in enumerate(matrix):
        for x, value in enumerate(line):
            if value == value:  # not NaN
                dark = lo >= 0 and value < 0.6  # viridis is dark below ~0.6
                ax.text(x, y, f"{value:+.2f}" if lo < 0 else f"{value:.2f}", ha="center",
                        va="center", fontsize=7, color="white" if dark else "black")
    ax.figure.colorbar(image, ax=ax, fraction=0.046)
