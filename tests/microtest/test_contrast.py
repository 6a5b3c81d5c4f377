"""Issue 31, item 5: the first `microtest` on the shipped checkpoint exited 1 on rows of
configurations the profile does not use (marlin ×2.25; the indexer at 131072 tokens, past the
checkpoint's 65536-token context). Those rows are now shown as contrast, not counted; rows of
the profile's own configuration decide the exit, and a runner the user names counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bisect.microtest.contrast import contrast_reason, mark_contrast
from dsv4bisect.microtest.results import MicrotestReport, Row


def row(value: float, **detail: object) -> Row:
    return Row("p", (0,), "case", "rel_err", value, 0.01, detail=detail, note="n")


def test_other_runners_and_contexts_past_the_checkpoint_are_contrast() -> None:
    assert contrast_reason(row(0.5, backend="marlin"), "triton", 65536) == \
        "runner marlin: not the profile's (triton)"
    assert contrast_reason(row(0.5, backend="triton"), "triton", 65536) == ""
    assert contrast_reason(row(0.5, backend="marlin"), None, 65536) == ""  # --moe-backend named
    assert contrast_reason(row(0.5, context=131072), "triton", 65536) == \
        "context 131072: beyond the checkpoint's 65536 tokens"
    assert contrast_reason(row(0.5, context=65536), "triton", 65536) == ""


def test_a_contrast_row_is_shown_but_does_not_decide_the_exit() -> None:
    bad = mark_contrast(row(0.5, backend="marlin"), "triton", None)
    assert bad.status == "contrast" and not bad.counted
    ok = mark_contrast(row(0.001, backend="marlin"), "triton", None)
    assert ok.status == "contrast-ok"
    fault = Row("p", (0,), "case", "rel_err", 0.5, 0.01, counted=False, detail={"backend": "x"})
    assert mark_contrast(fault, "triton", None) is fault  # a fault reference stays one
    report = MicrotestReport((bad, ok, row(0.001)), {})
    assert report.exit_code == 0 and report.contrast_outside == (bad,)
    own = mark_contrast(row(0.5, backend="triton"), "triton", None)
    assert MicrotestReport((bad, own), {}).exit_code == 1
    assert bad.to_dict()["contrast"].startswith("runner marlin")


def call(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from dsv4bisect.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["microtest", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_the_first_microtest_on_the_shipped_checkpoint_passes(tmp_path: Path, capsys) -> None:
    """The rows that failed in the report, on the shipped checkpoint (hash-topk-scaling under
    every runner; the indexer at 1k and 128k on its first CSA layer)."""
    base = ["hash-topk-scaling", "triton-indexer", "--layers", "2", "--contexts", "1k,128k",
            "--json"]
    code, out, err = call([*base, "--out", str(tmp_path / "a")], capsys)
    assert code == 0, err
    rows = json.loads(out)["rows"]
    contrast = {(r["patch"], r["case"].split(",")[0]) for r in rows if r["status"] == "contrast"}
    assert ("hash-topk-scaling", "marlin") in contrast
    own = [r for r in rows if r["detail"].get("backend") == "triton"]
    assert own and all(r["status"] == "ok" for r in own)
    assert all(r["contrast"].startswith("context 131072") for r in rows
               if r["detail"].get("context") == 131072)
    assert "reference-all's configuration" in err and "contrast rows" in err
    md = (tmp_path / "a" / "microtest.md").read_text()
    assert "contrast, outside (not counted)" in md and "runner marlin: not the profile's" in md
    # a runner the user names is the configuration under test: marlin's ×2.25 counts
    code, _, err = call(["hash-topk-scaling", "--layers", "2", "--moe-backend", "marlin",
                         "--out", str(tmp_path / "b")], capsys)
    assert code == 1 and "FAIL: " in err
