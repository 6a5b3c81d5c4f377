"""The SGLang plugin's entry point `main` and what it does in a scheduler, `run` (the package's
docstring says when SGLang calls it and what it installs). No torch, no SGLang imported here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from dsv4bisect import env as envvars

logger = logging.getLogger("dsv4bisect.plugin")


class PluginRefused(RuntimeError):
    """Raised after writing the receipts when a requested patch could not be installed, so
    SGLang's log shows the failure too (SGLang logs a plugin's exception and goes on)."""


def main() -> None:
    """Entry point (`sglang.srt.plugins`: `dsv4bisect = dsv4bisect.plugin.entry:main`)."""
    wire = os.environ.get(envvars.PATCHES, "").strip()
    switch_dir = os.environ.get(envvars.SWITCH_DIR, "").strip()
    if not wire and not switch_dir:
        return  # nothing requested: install nothing, change nothing
    from dsv4bisect.plugin.context import current_process

    process = current_process()
    if process.kind != "scheduler":
        logger.info("dsv4bisect: not a scheduler process (no model here); no hooks installed")
        return
    run(wire, process, os.environ.get(envvars.HOT, "").strip(),
        Path(switch_dir) if switch_dir else None)


def run(wire: str, process: object, hot: str = "",
        switch_dir: Path | None = None) -> list[object]:
    """Parse, detect, install, write receipts; raise PluginRefused if anything was refused.
    With `switch_dir` (hot mode) the candidates in `hot` are installed too, gated."""
    from dsv4bisect.base.versions import detect_sglang
    from dsv4bisect.patching.registry import builtin_patches
    from dsv4bisect.patching.wire import parse_patch_set
    from dsv4bisect.plugin.install import install_patches
    from dsv4bisect.plugin.receipts import OK_STATES, ReceiptWriter

    known = builtin_patches()
    patches = parse_patch_set(wire, known)  # PatchError on unknown names: SGLang logs it
    directory = os.environ.get(envvars.RECEIPTS)
    writer = ReceiptWriter(Path(directory) if directory else None, process)  # type: ignore[arg-type]
    info = detect_sglang()  # an unverified release is refused unless opted in
    if info.warning:
        logger.warning("dsv4bisect: %s", info.warning)
    if switch_dir is None:
        receipts = install_patches(patches, info, writer, known)
    else:
        from dsv4bisect.plugin.hot import install_hot

        receipts, _state = install_hot(patches, parse_patch_set(hot, known), info, writer,
                                       known, switch_dir)
    bad = [r for r in receipts if r.state not in OK_STATES]
    for r in receipts:
        logger.info("dsv4bisect: %s:%s %s%s", r.patch, r.variant, r.state,
                    f" ({r.reason})" if r.reason else "")
    if bad:
        raise PluginRefused("; ".join(f"{r.patch}: {r.state}: {r.reason}" for r in bad))
    return list(receipts)
