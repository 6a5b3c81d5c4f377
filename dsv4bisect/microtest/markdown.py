"""`microtest.md`: a report as Markdown (pure; the CLI writes it into the run directory)."""

from __future__ import annotations

import math

from dsv4bisect.microtest.results import MicrotestReport, Row, layer_ranges
from dsv4bisect.patchspec.spec import FAULT_LEGEND, FAULT_MARK

STATUS_MARK = {"ok": "ok", "FAIL": "**FAIL**", "info": "info", "fault": "fault (not counted)",
               "fault-ok": "fault, within (not counted)",
               "contrast": "contrast, outside (not counted)",
               "contrast-ok": "contrast, within (not counted)"}


def format_value(row: Row) -> str:
    v = row.value
    if row.metric in ("overlap", "share"):
        return "nan" if math.isnan(v) else f"{v:.4%}"
    if row.metric == "mismatch":
        return f"{v:.0f}"
    return "nan" if math.isnan(v) else f"{v:.3g}"


def format_tolerance(row: Row) -> str:
    if row.tolerance is None:
        return "-"
    sign = "≤" if row.bound == "max" else "≥"
    tol = f"{row.tolerance:.2%}" if row.metric in ("overlap", "share") else f"{row.tolerance:.3g}"
    return f"{sign} {tol}"


def render_markdown(report: MicrotestReport) -> str:
    s = report.setup
    verdict = "FAIL" if report.failed else "PASS"
    lines = [
        f"# dsv4bisect microtest: {verdict}",
        "",
        f"- checkpoint: `{s.get('checkpoint')}` ({s.get('model')})",
        f"- quantisation: {s.get('quant', {}).get('config_class', 'none')}",
        (f"- layers: {layer_ranges(list(s.get('layers', [])))}; contexts: "
         f"{', '.join(str(c) for c in s.get('contexts', []))}"),
        f"- device: {s.get('device')}; activations: {s.get('activations')}",
        (f"- {len(report.rows)} rows, {len(report.failed)} counted outside tolerance, "
         f"{len(report.contrast_outside)} contrast rows outside (not counted); "
         f"{report.tensors_read} tensors read; {report.seconds:.1f} s"),
        "",
    ]
    for patch in report.patches():
        rows = [r for r in report.rows if r.patch == patch]
        lines += [f"## {patch}", "", "| layers | case | value | tolerance | status | note |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            cells = (layer_ranges(r.layers), r.case, format_value(r), format_tolerance(r),
                     STATUS_MARK[r.status], note_text(r))
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    legend = fault_legend(report.rows)
    return "\n".join([*lines, legend, ""] if legend else lines)


def fault_legend(rows: tuple[Row, ...] | list[Row]) -> str | None:
    """The fault mark's legend where a row's case carries the mark."""
    return f"{FAULT_LEGEND}." if any(FAULT_MARK in r.case for r in rows) else None


def note_text(r: Row) -> str:
    """The row's note, led by why it is contrast (another configuration) when it is."""
    return f"{r.contrast}; {r.note}" if r.contrast and r.note else (r.contrast or r.note)
