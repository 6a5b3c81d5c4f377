"""Receipts written by the real installer in 8 scheduler processes' worth of hooks, read back by
the launcher's `check_receipts` for the seed TP8 profile."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hookenv import PROC, install
from sglang_tree import SglangTree, decoder_layer
from wheels import wheel_of

from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.engines.receipts import check_receipts
from dsv4bisect.errors import PatchError

PATCHES = {"mhc-bf16": "bf16", "hash-topk-scaling": "double-scale"}


def _scheduler(wheel: Path, rank: int, directory: Path, run_forward: bool = True) -> None:
    """One TP rank: install, build two MoE layers (hash + routed), run hc_pre and HashTopK."""
    with SglangTree(wheel) as t:
        install(t.version, PATCHES, directory, replace(PROC, tp_rank=rank))
        from sglang.srt.models.deepseek_v2 import DeepseekV2MoE
        from sglang.srt.models.deepseek_v4 import DeepseekV4DecoderLayer

        cfg = SimpleNamespace(num_hash_layers=1, nvfp4=True)
        hash_layer, _routed = DeepseekV2MoE(cfg, 0), DeepseekV2MoE(cfg, 1)
        if run_forward:
            layer = decoder_layer(DeepseekV4DecoderLayer)
            x = torch.randn(3, 4, 64).to(torch.bfloat16)
            layer.hc_pre(x, torch.randn(24, 256) * 0.06, torch.ones(3), torch.zeros(24))
            hash_layer.topk(torch.zeros(3, 8), torch.randn(3, 16), torch.tensor([1, 2, 3]))


@pytest.fixture
def cfg():
    return resolve("dsv4-flash-tp8", Overrides(only=tuple(PATCHES),
                                               sets=("patches.hash-topk-scaling.variant="
                                                     "double-scale",)))


def test_all_ranks_report_and_the_contract_sees_the_fault(hook_wheel, tmp_path, cfg):
    wheel = hook_wheel
    for rank in range(8):
        _scheduler(wheel, rank, tmp_path)
    report = check_receipts(cfg, tmp_path, cfg.processes)
    assert report.states["mhc-bf16"] == {f"server/tp{r}": "installed" for r in range(8)}
    hash_rows = [r for r in report.contract if r["is_hash"]]
    assert len(hash_rows) == 8 and all(r["times_applied"] == 2 for r in hash_rows)
    assert all(r["exactly_once"] for r in report.contract if not r["is_hash"])
    assert len(report.warnings) == 8 and "applied 2×" in report.warnings[0]


def test_a_missing_rank_is_an_error_naming_patch_role_and_count(tmp_path, cfg):
    wheel = wheel_of("0.5.13")
    for rank in range(7):
        _scheduler(wheel, rank, tmp_path)
    with pytest.raises(PatchError, match=r"mhc-bf16: receipts from 7 of 8 server"):
        check_receipts(cfg, tmp_path, cfg.processes)


def test_a_hook_never_called_is_an_error(tmp_path, cfg):
    wheel = wheel_of("0.5.13")
    for rank in range(8):
        _scheduler(wheel, rank, tmp_path, run_forward=rank != 3)
    with pytest.raises(PatchError, match=r"mhc-bf16: installed in server tp3 but never called"):
        check_receipts(cfg, tmp_path, cfg.processes)
