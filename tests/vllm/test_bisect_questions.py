"""Bisect questions over vLLM profiles: `--upgrade-from` between two verified releases (the
switch defaults that changed, vLLM's boolean and JSON options written back, the renamed
indexer cache switch translated) and `--good-config/--bad-config` between two configurations."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bisect.bisect.config_question import config_question
from dsv4bisect.bisect.upgrade import _renamed, code_bisect_hint, upgrade_differences
from dsv4bisect.config.resolve import Overrides
from dsv4bisect.errors import BisectError
from dsv4bisect.patching.switch_catalog import load_catalog


def _diffs(old: str, new: str) -> dict[str, tuple[str, str | None]]:
    _, _, diffs = upgrade_differences("dsv4-flash-vllm-tp8", old,
                                      Overrides(sets=(f"engine.vllm_version={new}",)))
    return {d.name: (d.good, d.left_out) for d in diffs}


def test_an_upgrade_sets_back_the_old_defaults() -> None:
    got = _diffs("0.28.0", "0.34.0")
    assert got["env:VLLM_USE_FUSED_MQA_TOPK"] == ("0", None)  # new and on in 0.34.0
    assert "new in 0.34.0" in (got["arg:--sparse-indexer-topk-backend"][1] or "")
    # the indexer cache switch: same behaviour (auto) under both names: not a candidate
    assert not any("indexer_kv_dtype" in n or "use_fp4" in n for n in got)
    got = _diffs("0.24.0", "0.28.0")
    assert got["arg:--attention-config.indexer_kv_dtype"] == ('"bf16"', None)  # a JSON key
    assert "leaves it unset" in (got["arg:--attention-config.use_fp4_indexer_cache"][1] or "")


def test_the_renamed_switch_is_read_under_its_old_name() -> None:
    before, value = _renamed("--attention-config.indexer_kv_dtype", load_catalog("0.22.0", "vllm"))
    assert before.name == "--attention-config.use_fp4_indexer_cache" and value == "auto"


def test_the_code_hint_speaks_vllm() -> None:
    hint = code_bisect_hint("dsv4-flash-vllm-tp8", "0.28.0", "0.34.0")
    assert "vLLM's commits v0.28.0..v0.34.0" in hint and "engine.vllm_version=0.28.0" in hint


def _profile(tmp: Path, name: str, body: str) -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(f"schema_version: 1\nname: {name}\nextends: dsv4-flash-vllm-tp8\n{body}")
    return str(path)


def test_two_vllm_configurations(tmp_path: Path) -> None:
    good = _profile(tmp_path, "a", "engine:\n  vllm_version: '0.34.0'\n")
    bad = _profile(tmp_path, "b", "engine:\n  vllm_version: '0.34.0'\n  env:\n"
                   "    VLLM_USE_FUSED_MQA_TOPK: '0'\n  args: [--trust-remote-code, "
                   "--gpu-memory-utilization, '0.85', --kv-cache-dtype, fp8_ds_mla, "
                   "--attention-config.indexer_kv_dtype, mxfp4]\n")
    q = config_question(good, bad)
    assert set(q.candidates) == {"env:VLLM_USE_FUSED_MQA_TOPK", "arg:--kv-cache-dtype",
                                 "arg:--attention-config.indexer_kv_dtype"}
    assert "vLLM 0.34.0's switch catalog" in q.tier_names["arg:--kv-cache-dtype"]
    assert q.tier_names["env:VLLM_USE_FUSED_MQA_TOPK"].startswith("kernel")


def test_two_releases_are_an_upgrade_not_a_config_difference(tmp_path: Path) -> None:
    bad = _profile(tmp_path, "new", "engine:\n  vllm_version: '0.34.0'\n")
    with pytest.raises(BisectError) as err:
        config_question("dsv4-flash-vllm-tp8", bad)
    assert "--upgrade-from 0.20.0" in err.value.hint
