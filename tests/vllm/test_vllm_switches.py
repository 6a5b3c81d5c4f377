"""`dsv4bisect switches --engine vllm`: each verified vLLM release's env switches and config
settings on DeepSeek-V4's path, in SGLang's catalog schema, shipped (regenerated from the wheels
by tests/vllm/test_wheels.py); the indexer cache switch renamed between releases."""

from __future__ import annotations

import json

import pytest

from dsv4bisect.base.vllm_releases import VERIFIED
from dsv4bisect.patching.switch_catalog import load_catalog, shipped_releases

SCHEMA = {"name", "kind", "type", "default", "read", "hot", "gates", "where", "tier"}
OLD, NEW = "--attention-config.use_fp4_indexer_cache", "--attention-config.indexer_kv_dtype"
# the V4-path env switches of 0.34.0 (field-update-2026-12.md §2 named these by grep: the 12 of
# the DSV4 modules and the kernels they call, plus the two global ones on V4's numerics path)
ENV_034 = {"VLLM_B12X_MOE_FP4_FORCE_A16", "VLLM_BATCH_INVARIANT", "VLLM_CACHE_ROOT",
           "VLLM_DISABLE_DSV4_MEGAMOE_SHARED_EXPERT_FUSION", "VLLM_HUMMING_INPUT_QUANT_CONFIG",
           "VLLM_MOE_SKIP_PADDING", "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD",
           "VLLM_SPARSE_INDEXER_MAX_DECODE_LOGITS_MB", "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB",
           "VLLM_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_E8M0", "VLLM_USE_DIRECT_DCP_A2A",
           "VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_USE_FUSED_MQA_TOPK"}


def test_the_newest_release_lists_its_settings_as_json(cli) -> None:
    got = cli("switches", "--engine", "vllm", "--json")
    assert got.returncode == 0, got.stderr
    data = json.loads(got.stdout)
    assert data["engine"] == "vllm" and data["release"] == "0.34.0"
    rows = data["switches"]
    assert len(rows) >= 30
    assert {r["name"] for r in rows if r["kind"] == "env"} == ENV_034
    for row in rows:
        assert SCHEMA <= set(row) <= SCHEMA | {"forced", "copies", "replaces"}, row
        assert row["hot"] is False  # every vLLM trial is a fresh launch
        assert row["read"] in ("import", "construction", "call")
    by = {r["name"]: r for r in rows}
    assert by["--moe-backend"]["gates"] == "KernelConfig.moe_backend"
    assert by["--kv-cache-dtype"]["tier"] == "precision"
    assert by["--tensor-parallel-size"]["tier"] == "topology"
    assert by[NEW]["replaces"] == [OLD] and OLD not in by


def test_a_profile_picks_its_release(cli) -> None:
    got = cli("switches", "dsv4-flash-vllm-tp8")
    assert got.returncode == 0, got.stderr
    assert "vLLM 0.20.0:" in got.stdout and "use_fp4_indexer_cache" in got.stdout
    got = cli("switches", "--engine", "vllm", "--release", "0.28.0")
    assert "vLLM 0.28.0:" in got.stdout and "(was" in got.stdout


@pytest.mark.parametrize("release", VERIFIED)
def test_the_indexer_cache_switch_across_releases(release: str) -> None:
    catalog = load_catalog(release, "vllm")
    old, new = catalog.get(OLD), catalog.get(NEW)
    if release in ("0.20.0", "0.22.0"):
        assert old is not None and new is None
    elif release == "0.24.0":  # both, independent: indexer_kv_dtype was not V4's yet
        assert old is not None and new is not None and not new.replaces
    elif release == "0.28.0":  # the old name is a deprecated alias of the new
        assert old is not None and new is not None and new.replaces == (OLD,)
    else:
        assert old is None and new is not None and new.replaces == (OLD,)


def test_every_verified_release_ships_a_catalog() -> None:
    assert shipped_releases("vllm") == list(VERIFIED)
    assert shipped_releases("sglang")[0] == "0.5.13"  # SGLang's are untouched


def test_bad_input_is_one_error_and_exit_5(cli, tmp_path) -> None:
    (tmp_path / "not-a.whl").write_text("x")
    for args in (("switches", "--engine", "vllm", "--release", "0.19.0"),
                 ("switches", "--vllm-src", str(tmp_path / "missing")),
                 ("switches", "--vllm-src", str(tmp_path / "not-a.whl"))):
        got = cli(*args)
        assert got.returncode == 5, (args, got.stderr)
        assert got.stderr.startswith("error: ") and "\nhint: " in got.stderr, got.stderr
