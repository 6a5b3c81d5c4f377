"""Which rows concern the configuration under test, and which are shown for contrast.

The default microtest measures every MoE runner choice and contexts up to 128k, so a known-bad
configuration (marlin with NVFP4 experts applies `routed_scaling_factor` twice) appears next to
the one the profile deploys. Rows of another runner than the profile's, and rows at a context
longer than the checkpoint's `max_position_embeddings` (a length it never serves), are marked
`contrast`: shown, not counted. Runners the user names with `--moe-backend` all count.
"""

from __future__ import annotations

import dataclasses

from dsv4bisect.microtest.results import Row
from dsv4bisect.microtest.runners import RUNNER_LABELS


def contrast_reason(row: Row, runner: str | None, max_context: int | None) -> str:
    """Why `row` is not the configuration under test ("" when it is)."""
    backend = row.detail.get("backend")
    if runner is not None and backend is not None and backend != runner:
        return (f"runner {RUNNER_LABELS.get(backend, backend)}: not the profile's "
                f"({RUNNER_LABELS.get(runner, runner)})")
    context = row.detail.get("context")
    if max_context is not None and isinstance(context, int) and context > max_context:
        return f"context {context}: beyond the checkpoint's {max_context} tokens"
    return ""


def mark_contrast(row: Row, runner: str | None, max_context: int | None) -> Row:
    """`row`, marked and not counted if it is contrast (fault and informational rows as they
    are: they already do not decide the exit)."""
    if not row.counted or row.tolerance is None:
        return row
    why = contrast_reason(row, runner, max_context)
    return dataclasses.replace(row, counted=False, contrast=why) if why else row
