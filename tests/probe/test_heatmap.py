"""The accuracy heatmap: a real PNG with one panel row per family, or None without data."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bisect.report.heatmap import accuracy_grid, render_heatmap


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
