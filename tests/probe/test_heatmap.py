"""The accuracy heatmap: a real PNG with one panel row per family, or None without data."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bisect.report.heatmap import (
    ROW_INCHES,
    TITLE_LINE_INCHES,
    accuracy_grid,
    bucket_gates,
    heading,
    panel_rows,
    render_heatmap,
)


def rows(correct_at: set[tuple[int, float]]) -> list[dict]:
    out = []
    for fam in ("needle", "copy"):
        for n in (256, 1024):
            for d in (0.1, 0.5, 0.9):
                for i in range(2):
                    out.append({"family": fam, "length": n, "depth": d,
                                "correct": (n, d) in correct_at or i == 0})
    return out + [{"family": "drift", "length": 256, "depth": 0.1, "correct": None}]


def test_accuracy_grid() -> None:
    grid = accuracy_grid(rows({(256, 0.1)}), "needle")
    assert grid[(256, 0.1)] == 1.0 and grid[(1024, 0.9)] == 0.5 and len(grid) == 6
    assert accuracy_grid(rows(set()), "vartrack") == {}


def test_render_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    base = rows({(n, d) for n in (256, 1024) for d in (0.1, 0.5, 0.9)})
    png = render_heatmap(base, rows({(256, 0.1)}), tmp_path / "sub" / "heat.png", title="t")
    assert png == tmp_path / "sub" / "heat.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert render_heatmap([], [], tmp_path / "none.png") is None


# -- issue 31, item 3: the picture shows what decided the verdict -------------------------------
def drift_verdict(decided_by_drift: bool) -> dict:
    buckets = {"0-255": {"n": 300, "kl_mean": 0.01, "top1_agreement": 0.99},
               "256-511": {"n": 300, "kl_mean": 0.28, "top1_agreement": 0.91}}
    drift = {"status": "fail",
             "trigger": {"status": "fail", "where": "positions 256-511", "kl_mean": 0.28,
                         "top1_agreement": 0.91},
             "gates": {"warn_kl": 0.001, "fail_kl": 0.02, "warn_top1": 0.99, "fail_top1": 0.97},
             "candidate": {"n_positions": 600, "kl_mean": 0.14, "top1_agreement": 0.95,
                           "first_divergence": 7, "by_position": buckets},
             "floor": {"by_position": {k: {"kl_mean": 0.0, "top1_agreement": 1.0}
                                       for k in buckets}}}
    reasons = ["drift FAIL (positions 256-511): mean KL 0.28 nats (warn > 0.001, fail > 0.02)"]
    if not decided_by_drift:
        reasons.insert(0, "accuracy: lost 5, gained 0 of 24 paired answers (exact McNemar "
                          "p = 0.031 < 0.05)")
    return {"verdict": "FAIL", "reasons": reasons, "drift": drift,
            "families": {"needle": {"b": 0}, "copy": {"b": 5}}}


def test_the_heading_names_what_decided_and_the_drift_row_comes_first_when_it_did() -> None:
    v = drift_verdict(True)
    assert heading("FAIL: reference-all", v) == (
        "FAIL: reference-all\ndecided by: drift FAIL (positions 256-511): mean KL 0.28 nats "
        "(warn > 0.001, fail > 0.02)")
    assert panel_rows(["needle", "copy"], v) == ["drift", "needle", "copy"]
    acc = drift_verdict(False)
    assert heading("FAIL: x", acc).endswith("decided by: accuracy: lost 5, gained 0 of 24 "
                                            "paired answers (exact McNemar p = 0.031 < 0.05)")
    assert panel_rows(["needle", "copy"], acc) == ["needle", "copy", "drift"]
    assert panel_rows(["needle"], None) == ["needle"] and heading("t", None) == "t"


def test_a_drift_fail_is_drawn(tmp_path: Path) -> None:
    """The report's case: every accuracy panel reads +0.00 and drift failed; the PNG now has a
    drift row on top of the two families' rows (the height says how many rows)."""
    pytest.importorskip("matplotlib")
    same = rows({(n, d) for n in (256, 1024) for d in (0.1, 0.5, 0.9)})
    png = render_heatmap(same, same, tmp_path / "heat.png", title="FAIL: reference-all",
                         verdict=drift_verdict(True))
    assert png is not None
    height = int.from_bytes(png.read_bytes()[20:24], "big")  # IHDR height
    # drift, needle, copy: three rows of panels, under the title's two lines
    assert height == round((ROW_INCHES * 3 + TITLE_LINE_INCHES * 2) * 110)
    without = render_heatmap(same, same, tmp_path / "plain.png", title="t")
    assert int.from_bytes(without.read_bytes()[20:24], "big") == round(
        (ROW_INCHES * 2 + TITLE_LINE_INCHES) * 110)


# -- issue 41, item 10: pictures that mislead ----------------------------------------------------
def warn_verdict() -> dict:
    """A drift WARN as the judge writes it: the A/A note first, the drift reason later, the
    trigger in the answer positions (its gate 4.6e-07), a null model per bucket."""
    buckets = {"0-255": {"n": 300, "kl_mean": 2e-4, "top1_agreement": 1.0},
               "256-511": {"n": 300, "kl_mean": 3e-4, "top1_agreement": 1.0}}
    null_views = {f"positions {k}": {"warn_kl": 5e-4, "warn_top1": 0.98} for k in buckets}
    drift = {"status": "warn",
             "trigger": {"status": "warn", "where": "answer positions", "kl_mean": 9e-7,
                         "top1_agreement": 1.0},
             "gates": {"warn_kl": 4.6e-07, "warn_top1": 0.99},
             "candidate": {"n_positions": 600, "kl_mean": 2.5e-4, "top1_agreement": 1.0,
                           "first_divergence": None, "by_position": buckets},
             "null": {"views": {**null_views, "answer positions": {"warn_kl": 4.6e-07}}}}
    return {"verdict": "WARN", "drift": drift, "families": {"needle": {"b": 0}},
            "reasons": ["the A/A repeat covers 48 of 96 paired requests; the noise floor comes "
                        "from those", "drift WARN (answer positions): mean KL 9e-07 nats"]}


def test_the_heading_is_what_decided_not_a_side_note_and_never_cut() -> None:
    assert heading("WARN: x", warn_verdict()) == ("WARN: x\ndecided by: drift WARN (answer "
                                                  "positions): mean KL 9e-07 nats")
    seeds = ", ".join(str(s) for s in range(40))
    fail = {"verdict": "FAIL", "reasons": [f"hard signature truncated in seeds {seeds}"]}
    text = heading("FAIL: x", fail)
    assert text.replace("\n", " ").endswith(f"seeds {seeds}")  # the whole seed list


def test_a_gate_of_another_view_is_not_drawn_over_the_buckets_bars(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    v = warn_verdict()
    assert bucket_gates(v["drift"], "warn_kl") == {"0-255": 5e-4, "256-511": 5e-4}
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2), squeeze=False)
    from dsv4bisect.report.heatmap import _drift_row

    _drift_row(axes[0], v["drift"], decided=True)
    kl_axis = axes[0][0]
    drawn = [y for line in kl_axis.get_lines() for y in line.get_ydata()]
    assert 4.6e-07 not in drawn and 5e-4 in drawn  # each bucket's own gate, not the answer's
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    from matplotlib.transforms import Bbox

    for ax in axes[0][:2]:  # the legend overlaps no bar (as drawn: clipped to its axes)
        legend = ax.get_legend().get_window_extent(renderer)
        shown = [Bbox.intersection(bar.get_window_extent(renderer), ax.bbox)
                 for bar in ax.patches]
        assert all(b is not None for b in shown[:1])
        assert not any(b is not None and b.overlaps(legend) for b in shown)
    plt.close(fig)
