"""Install dsv4bisect hooks into a synthetic sglang tree, as the plugin does in SGLang."""

from __future__ import annotations

from pathlib import Path

from dsv4bisect.base.versions import check_version
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.plugin.install import install_patches
from dsv4bisect.plugin.receipts import ProcessInfo, Receipt, ReceiptWriter

PROC = ProcessInfo(pid=1, role="server", kind="scheduler", tp_rank=0, dp_rank=0, pp_rank=0)


def install(version: str, patches: dict[str, str], directory: Path | None = None,
            process: ProcessInfo = PROC) -> tuple[list[Receipt], ReceiptWriter]:
    """Run the real installer (real HookRegistry from the wheel) for `patches`."""
    writer = ReceiptWriter(directory, process)
    receipts = install_patches(patches, check_version(version), writer, builtin_patches())
    return receipts, writer


def by_patch(receipts: list[Receipt]) -> dict[str, Receipt]:
    return {r.patch: r for r in receipts}
