"""The dsv4bisect SGLang plugin: installs the hooks of the patches named in DSV4BISECT_PATCHES.

SGLang runs every general plugin of the entry-point group `sglang.srt.plugins` that
`SGLANG_PLUGINS` whitelists, in the engine's main process and at the top of each scheduler
process (`run_scheduler_process`), before the model is built and before CUDA graphs are
captured. `main()` is that entry point. In a scheduler it reads the patch set (wire format,
`dsv4bisect.patching.wire`), detects the SGLang version and hook layout (a release outside the
verified list is refused unless DSV4BISECT_ALLOW_UNVERIFIED_SGLANG=1), installs exactly those
patches' hooks (or checks an upstream switch's value) and writes one receipt per patch into
DSV4BISECT_RECEIPTS. With no patches it
installs nothing and writes nothing. In hot mode (DSV4BISECT_SWITCH_DIR set) it also installs
the candidates of DSV4BISECT_HOT behind per-call gates and the switch in `Scheduler.flush_cache`
(`dsv4bisect.plugin.hot`, docs/hot-switching.md). Outside a scheduler (no model is built
there) it does nothing. This module imports no torch and no SGLang; the hook modules do, when installing.
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
    """Entry point (`sglang.srt.plugins`: `dsv4bisect = dsv4bisect.plugin:main`)."""
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
