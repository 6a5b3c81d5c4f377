"""A hot SGLang launch is accepted only when every scheduler installed the switch; receipts of
gated hot patches that are off at launch are expected, not "unrequested" (engines/receipts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bisect import env as envvars
from dsv4bisect.bisect.trials.engine_pool import with_env
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.engines.receipts import HOT_RECEIPT, check_receipts
from dsv4bisect.errors import PatchError
from dsv4bisect.plugin.receipts import ProcessInfo, Receipt, ReceiptWriter


def _hot_cfg(tmp_path: Path):
    cfg = resolve("dsv4-flash-tp8", Overrides(only=()))  # the good end: nothing on
    return with_env(cfg, {envvars.SWITCH_DIR: str(tmp_path / "switch"),
                          envvars.HOT: "mhc-bf16,mma-decode"})


def _write(directory: Path, ranks: range, patches: dict[str, str]) -> None:
    for rank in ranks:
        proc = ProcessInfo(pid=1000 + rank, role="server", kind="scheduler", tp_rank=rank)
        writer = ReceiptWriter(directory, proc)
        for patch, variant in patches.items():
            writer.write(Receipt(patch, variant, proc, "0.5.13", "0.5.13", [], "installed"))


def test_hot_launch_needs_the_switch_in_every_scheduler(tmp_path: Path) -> None:
    cfg = _hot_cfg(tmp_path)
    server = next(p for p in cfg.processes if p.gets_patches)
    assert envvars.PLUGIN_NAME in server.env_dict()[envvars.SGLANG_PLUGINS]  # loads with 0 on
    _write(tmp_path, range(server.schedulers - 1), {HOT_RECEIPT: "generation 0"})
    with pytest.raises(PatchError, match="hot switching: receipts from 7 of 8 server"):
        check_receipts(cfg, tmp_path, cfg.processes)


def test_gated_hot_patches_are_expected_and_the_launch_passes(tmp_path: Path) -> None:
    cfg = _hot_cfg(tmp_path)
    _write(tmp_path, range(8), {HOT_RECEIPT: "generation 0", "mhc-bf16": "bf16",
                                "mma-decode": "split-k"})
    check_receipts(cfg, tmp_path, cfg.processes)  # nothing requested, all switchable: fine
    _write(tmp_path, range(8), {"triton-indexer": "bf16"})  # not hot, not requested
    with pytest.raises(PatchError, match="not requested: triton-indexer"):
        check_receipts(cfg, tmp_path, cfg.processes)
