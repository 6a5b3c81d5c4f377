"""The dsv4bisect vLLM plugin: installs the hooks of the patches named in DSV4BISECT_PATCHES in
every vLLM worker and writes one receipt per patch per worker.

vLLM runs every entry point of the group `vllm.general_plugins` that `VLLM_PLUGINS` allows,
once per process (`vllm/plugins/__init__.py` `load_general_plugins`): in each worker at the top
of `WorkerWrapperBase.init_worker`, before the model is built, and also in the engine core, the
API server and wherever the arguments are parsed. `main()` is that entry point:

- no patches requested: it returns at once (installs nothing, changes nothing);
- in a worker (the `init_worker` frame is on the stack): it installs the hooks now;
- elsewhere: it wraps `init_worker`, so that a worker forked from this process (vLLM forks its
  workers when CUDA is not initialised; they inherit `plugins_loaded = True` and never call the
  plugin themselves) installs them at the start of its own `init_worker`.

vLLM calls the plugin outside any try (0.34.0 `load_general_plugins`), so `main()` never raises:
a refused or failed patch is written in its receipt and the launcher's receipt check fails the
trial. An unverified vLLM release (unless DSV4BISECT_ALLOW_UNVERIFIED_VLLM=1) and one older
than 0.20.0 are refused. This module imports no torch and no vLLM; the hook modules do, when
installing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from dsv4bisect import env as envvars

logger = logging.getLogger("dsv4bisect.plugin.vllm")
_DONE: dict[str, Any] = {}  # "pid": the process that installed (a fork must install again)


def main() -> None:
    """Entry point (`vllm.general_plugins`: `dsv4bisect = dsv4bisect.plugin.vllm:main`)."""
    wire = os.environ.get(envvars.PATCHES, "").strip()
    if not wire:
        return
    try:
        from dsv4bisect.plugin.vllm.context import current_process

        process = current_process()
        if process.kind == "worker":
            install_in_worker(wire, process)
        else:
            wrap_init_worker(wire)
    except Exception:  # noqa: BLE001 - vLLM would die on it; the receipts tell the launcher
        logger.exception("dsv4bisect: the vLLM plugin failed")


def wrap_init_worker(wire: str) -> None:
    """AROUND WorkerWrapperBase.init_worker: install in the worker before vLLM's own init."""
    import pkgutil

    from dsv4bisect.plugin.vllm.context import worker_info
    from dsv4bisect.vllm_hooks.targets import WORKER

    owner_path, attr = WORKER.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    original = getattr(owner, attr)
    if getattr(original, "__dsv4bisect__", False):
        return

    def init_worker(self: Any, all_kwargs: Any) -> Any:
        try:
            install_in_worker(wire, worker_info(self, all_kwargs))
        except Exception:  # noqa: BLE001
            logger.exception("dsv4bisect: the vLLM plugin failed in a worker")
        return original(self, all_kwargs)

    init_worker.__wrapped__ = original  # type: ignore[attr-defined]
    init_worker.__dsv4bisect__ = True  # type: ignore[attr-defined]
    setattr(owner, attr, init_worker)


def install_in_worker(wire: str, process: Any) -> list[Any]:
    """Parse, detect, install, write receipts (once per process)."""
    if _DONE.get("pid") == os.getpid():
        return list(_DONE.get("receipts", []))
    _DONE["pid"] = os.getpid()
    from dsv4bisect.base.vllm_releases import detect_vllm
    from dsv4bisect.patching.registry import builtin_patches
    from dsv4bisect.patching.wire import parse_patch_set
    from dsv4bisect.plugin.receipts import ReceiptWriter
    from dsv4bisect.plugin.vllm.install import install_flush, install_patches

    known = builtin_patches()
    patches = parse_patch_set(wire, known)
    directory = os.environ.get(envvars.RECEIPTS)
    writer = ReceiptWriter(Path(directory) if directory else None, process)
    info = detect_vllm()
    if info.warning:
        logger.warning("dsv4bisect: %s", info.warning)
    receipts = install_patches(patches, info, writer, known)
    if info.layout is not None and any(r.expects_call for r in receipts):
        problem = install_flush(writer, receipts)
        if problem is not None:
            for rec in receipts:
                if rec.state == "installed" and rec.expects_call:
                    rec.notes.append(f"call evidence cannot be written: {problem}")
                    writer.write(rec)
    _DONE["receipts"] = receipts
    for r in receipts:
        logger.info("dsv4bisect: %s:%s %s%s", r.patch, r.variant, r.state,
                    f" ({r.reason})" if r.reason else "")
    return receipts
