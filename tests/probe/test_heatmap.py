"""The accuracy heatmap: a real PNG with one panel row per family, or None without data."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bisect.report.heatmap import accuracy_grid, heading, panel_rows, render_heatmap


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
    assert height == round(3.2 * 3 * 110)  # drift, needle, copy: three rows of panels
    without = render_heatmap(same, same, tmp_path / "plain.png", title="t")
    assert int.from_bytes(without.read_bytes()[20:24], "big") == round(3.2 * 2 * 110)
