"""Accuracy heatmaps: length × depth for the baseline, the candidate and their difference.

One row of panels per accuracy family present in the rows (arms and turn counts pooled per
cell). matplotlib is optional (`pip install dsv4bisect[plots]`) and imported only when a plot is
drawn; without it `render_heatmap` returns None and the caller says `PLOTS_SKIPPED`.
"""

from __future__ import annotations

import os
import textwrap
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PLOTS_SKIPPED = "plots skipped: matplotlib is not installed (pip install 'dsv4bisect[plots]')"
ACCURACY_FAMILIES = ("needle", "copy", "vartrack")

Grid = dict[tuple[int, float], float]  # (length, depth) -> accuracy
HEADING_WIDTH = 150  # characters of the title per line, at 10 pt across the 12-inch figure
ROW_INCHES, TITLE_LINE_INCHES = 3.2, 0.22


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


# Reasons a verdict states beside what decided it (probe/judge.py): never its headline.
SIDE_NOTES = ("the A/A repeat covers", "no A/A repeat")


def deciding_reason(verdict: dict[str, Any] | None) -> str:
    """What decided the verdict, among its reasons: the drift's on a WARN (drift alone WARNs),
    else the first that is not a side note (a FAIL's failed family or cell comes first)."""
    reasons = [str(r).splitlines()[0] for r in (verdict or {}).get("reasons") or () if r]
    if (verdict or {}).get("verdict") == "WARN" or (verdict or {}).get("decided_by") == "drift":
        drift = [r for r in reasons if r.startswith("drift")]
        reasons = drift or reasons
    decisive = [r for r in reasons if not r.startswith(SIDE_NOTES)
                and "have no counterpart in the candidate run" not in r]
    return (decisive or reasons or [""])[0]


def drift_decided(verdict: dict[str, Any] | None) -> bool:
    """The drift gates, not the accuracy families, made the verdict what it is."""
    drift = (verdict or {}).get("drift") or {}
    return drift.get("status") in ("fail", "warn") and deciding_reason(verdict).startswith("drift")


def _family_order(families: list[str], verdict: dict[str, Any] | None) -> list[str]:
    """The families that lost the most answers first (the ones that decide an accuracy FAIL)."""
    fams = (verdict or {}).get("families") or {}
    return sorted(families, key=lambda f: -int((fams.get(f) or {}).get("b") or 0))


def panel_rows(families: list[str], verdict: dict[str, Any] | None) -> list[str]:
    """The rows of panels, top to bottom: `drift` (when the verdict has per-position drift)
    first if it decided the verdict, else after the accuracy `families`."""
    drift = (verdict or {}).get("drift") or {}
    if not (drift.get("candidate") or {}).get("by_position"):
        return list(families)
    return ["drift", *families] if drift_decided(verdict) else [*families, "drift"]


def heading(title: str | None, verdict: dict[str, Any] | None) -> str:
    """`title`, then what decided the verdict, whole (a FAIL's seed list is evidence), wrapped
    to the figure's width."""
    decided = deciding_reason(verdict)
    if not decided:
        return title or ""
    text = textwrap.fill(f"decided by: {decided}", HEADING_WIDTH)
    return f"{title}\n{text}" if title else text


def render_heatmap(baseline_rows: Iterable[dict[str, Any]],
                   candidate_rows: Iterable[dict[str, Any]],
                   path: str | os.PathLike[str], *, title: str | None = None,
                   verdict: dict[str, Any] | None = None) -> Path | None:
    """Write the PNG; None when matplotlib is missing or there is nothing to plot.

    With `verdict` (Verdict.to_dict()), the title says what decided it, and the drift views
    (mean KL and top-1 agreement per position bucket, against the A/A floor and the gates) are
    drawn as a row of their own: first when drift decided the verdict; the accuracy families
    follow, the one that lost most answers first."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never open a window
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    base, cand = list(baseline_rows), list(candidate_rows)
    families = _family_order([f for f in ACCURACY_FAMILIES if accuracy_grid(base, f)], verdict)
    drift = (verdict or {}).get("drift") or {}
    rows_of_panels = panel_rows(families, verdict)
    if not rows_of_panels:
        return None
    head = heading(title, verdict)
    title_in = TITLE_LINE_INCHES * (head.count("\n") + 1) if head else 0.0
    height = ROW_INCHES * len(rows_of_panels)
    fig, axes = plt.subplots(len(rows_of_panels), 3, figsize=(12, height + title_in),
                             squeeze=False)
    for row, fam in enumerate(rows_of_panels):
        if fam == "drift":
            _drift_row(axes[row], drift, decided=drift_decided(verdict))
            continue
        b, c = accuracy_grid(base, fam), accuracy_grid(cand, fam)
        lengths = sorted({k[0] for k in b} | {k[0] for k in c})
        depths = sorted({k[1] for k in b} | {k[1] for k in c})
        diff = {k: c[k] - b[k] for k in b if k in c}
        lost = int((((verdict or {}).get("families") or {}).get(fam) or {}).get("b") or 0)
        mark = f" (lost {lost})" if lost else ""
        panels = ((b, "baseline", "viridis", 0.0, 1.0), (c, "candidate", "viridis", 0.0, 1.0),
                  (diff, f"candidate − baseline{mark}", "RdBu", -1.0, 1.0))
        for col, (grid, name, cmap, lo, hi) in enumerate(panels):
            _panel(axes[row][col], _matrix(grid, lengths, depths), lengths, depths,
                   f"{fam}: {name}", cmap, lo, hi)
    if head:
        fig.suptitle(head, fontsize=10, y=0.995, va="top")
    # the panels below the heading's lines, however many the reason takes
    fig.tight_layout(rect=(0, 0, 1, 1 - (title_in + 0.05) / (height + title_in)))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def bucket_gates(drift: dict[str, Any], gate: str) -> dict[str, float]:
    """The WARN gate `gate` (warn_kl, warn_top1) of each position bucket the bars show: the
    null model's view of that bucket; without a null model, only the triggering bucket's
    gate is known (the floor's gates of the others are not kept). A gate of another view (all
    positions, the answer positions) is never drawn over the buckets' bars: it bounds a mean
    over other positions."""
    views = ((drift.get("null") or {}).get("views")) or {}
    out = {}
    for key in ((drift.get("candidate") or {}).get("by_position") or {}):
        value = (views.get(f"positions {key}") or {}).get(gate)
        if value is not None:
            out[key] = float(value)
    where = str((drift.get("trigger") or {}).get("where") or "")
    if not views and where.startswith("positions ") and gate in (drift.get("gates") or {}):
        out[where.removeprefix("positions ")] = float(drift["gates"][gate])
    return out


def _drift_row(axes: Any, drift: dict[str, Any], *, decided: bool) -> None:
    """Mean KL and top-1 agreement per position bucket: candidate, A/A floor, each bucket's
    own WARN gate; the bucket that triggered the verdict in red. The legends sit below the
    axes, never over a bar."""
    cand = drift["candidate"]["by_position"]
    floor = ((drift.get("floor") or {}).get("by_position")) or {}
    keys = list(cand)
    where = str((drift.get("trigger") or {}).get("where") or "")
    hot = [f"positions {k}" == where for k in keys]
    label = " (decided the verdict)" if decided else ""
    x = list(range(len(keys)))
    for ax, metric, gate, name in (
            (axes[0], "kl_mean", "warn_kl", "mean KL (nats)"),
            (axes[1], "top1_agreement", "warn_top1", "top-1 agreement")):
        values = [float(cand[k].get(metric) or 0.0) for k in keys]
        ax.bar(x, values, color=["tab:red" if h else "tab:blue" for h in hot],
               label="candidate")
        if floor:
            ax.plot(x, [float((floor.get(k) or {}).get(metric) or 0.0) for k in keys], "k_",
                    markersize=14, label="A/A floor")
        gates = bucket_gates(drift, gate)
        if gates:
            at = [i for i, k in enumerate(keys) if k in gates]
            ax.plot(at, [gates[keys[i]] for i in at], "_", color="tab:red", markersize=18,
                    markeredgewidth=1.5, label=f"{gate.replace('_', ' ')} (the bucket's)")
        if metric == "top1_agreement":
            low = min([*values, *gates.values()])
            ax.set_ylim(max(0.0, low - 0.05), 1.005)
        ax.set_xticks(x, keys, fontsize=7, rotation=30)
        ax.set_xlabel("position bucket (tokens)", fontsize=8)
        ax.set_title(f"drift{label}: {name}", fontsize=10)
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=3,
                  frameon=False)
    c = drift["candidate"]
    trigger_gates = drift.get("gates") or {}
    text = [f"status: {drift.get('status')}", f"trigger: {where or '-'}",
            f"mean KL {float(c.get('kl_mean') or 0):.3g} nats over {c.get('n_positions')} positions",
            f"top-1 agreement {float(c.get('top1_agreement') or 0):.2%}",
            f"first divergence at token {c.get('first_divergence')}"]
    if "warn_kl" in trigger_gates and not where.startswith("positions "):
        text.append(f"warn KL of {where}: {float(trigger_gates['warn_kl']):.3g}")
        text.append("(a mean over those positions:")
        text.append(" not drawn over the buckets)")
    axes[2].axis("off")
    axes[2].text(0.0, 0.9, "\n".join(text), va="top", fontsize=9, family="monospace",
                 transform=axes[2].transAxes)


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
