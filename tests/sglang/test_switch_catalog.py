"""The shipped switch catalogs (dsv4bisect/patching/switch_data/) are what discovery finds in
each verified release's wheel, hold the known DeepSeek-V4 switches with the hand-verified
reading modes of the patches' rules, and nothing unrelated to DeepSeek-V4 (docs/sglang.md,
"Switch discovery")."""

from __future__ import annotations

import json
import re

import pytest

from dsv4bisect.base.versions import VERIFIED, parse_version
from dsv4bisect.errors import ConfigError
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.patching.switch_catalog import (
    TIERS,
    Switch,
    dumps,
    load_catalog,
    prior_weights,
    shipped_releases,
    tier_of,
)
from dsv4bisect.patchspec.spec import ARCHS
from dsv4bisect.plugin.discover import discover, env_declarations
from dsv4bisect.plugin.hot import deliverable_env
from dsv4bisect.plugin.static import SourceTree

SCHEMA = {"name", "kind", "type", "default", "read", "hot", "gates", "where", "tier"}
OPTIONAL = {"forced", "copies", "also", "other_vendor"}
# Per release: (env switches, server arguments), regenerated with the data
# (python tests/benchmarks/gen_switch_catalog.py) and checked by a reader of the diff.
COUNTS = {
    "0.5.13": (35, 39), "0.5.13.post1": (35, 39), "0.5.14": (37, 47), "0.5.15": (41, 48),
    "0.5.15.post1": (41, 48), "0.5.16": (46, 48), "0.5.17": (51, 48), "0.5.18": (40, 49),
    "0.5.19": (45, 49), "0.5.20": (48, 49), "0.5.21": (55, 51), "0.5.22": (60, 50),
    "0.5.23": (72, 50),
}
# Per release: (hot, env switches read at every call). Hot: only the per-call switches the
# plugin's switch file delivers (the built-in patches' env rules, plugin/hot.py deliverable_env).
HOT = {
    "0.5.13": (2, 17), "0.5.13.post1": (2, 17), "0.5.14": (2, 18), "0.5.15": (3, 20),
    "0.5.15.post1": (3, 20), "0.5.16": (3, 19), "0.5.17": (3, 21), "0.5.18": (4, 14),
    "0.5.19": (4, 17), "0.5.20": (4, 19), "0.5.21": (4, 23), "0.5.22": (4, 29),
    "0.5.23": (4, 32),
}
# Known entries: (release, name) -> fields they must have (from each release's own source).
KNOWN = {
    ("0.5.23", "SGLANG_OPT_FP8_WO_A_GEMM"): {
        "read": "import", "hot": False, "default": {"default": True, "sm120": False},
        "where": "sglang/srt/models/deepseek_v4.py:276", "tier": "precision"},
    ("0.5.23", "SGLANG_OPT_USE_TILELANG_INDEXER"): {
        "read": "call", "hot": True, "default": {"default": False, "sm120": True},
        "tier": "kernel"},
    ("0.5.23", "SGLANG_OPT_FUSE_MHC_POST_PRE"): {
        "read": "construction", "hot": False, "type": "bool", "tier": "kernel"},
    ("0.5.23", "SGLANG_DSV4_FP4_EXPERTS"): {
        "read": "construction", "default": True, "gates": "ModelConfig.__init__ (+1)",
        "where": "sglang/srt/configs/model_config.py:746"},
    ("0.5.23", "SGLANG_SM120_FLASHMLA_BACKEND"): {
        "read": "call", "hot": True, "default": "flashinfer",
        "copies": ("sglang.kernels.ops.attention.flash_mla_sm120._sm120_default_backend",)},
    ("0.5.23", "SGLANG_OPT_USE_TOPK_V2"): {"forced": ("hip", "sm120")},
    ("0.5.23", "--kv-cache-dtype"): {"kind": "arg", "default": "auto", "tier": "precision",
                                     "where": "sglang/srt/arg_groups/fields/model.py:197"},
    ("0.5.23", "--enable-dp-attention"): {"kind": "arg", "type": "bool", "tier": "topology"},
    # 0.5.23 picks flashinfer_mxfp4 only for an MXFP4-experts checkpoint: no arch default
    ("0.5.23", "--moe-runner-backend"): {"kind": "arg", "default": "auto", "tier": "kernel"},
    ("0.5.21", "SGLANG_OPT_FP8_WO_A_GEMM"): {"read": "import", "hot": False},
    ("0.5.16", "SGLANG_OPT_USE_TILELANG_INDEXER"): {"forced": ("sm120",)},
    ("0.5.13", "SGLANG_OPT_FUSE_MHC_POST_PRE"): {"default": False},
    ("0.5.13", "SGLANG_OPT_USE_TRITON_FUSED_MHC"): {"kind": "env"},
    # read per call, but no patch models it: the switch file cannot carry it, so not hot
    ("0.5.13", "SGLANG_SM120_TRITON_FLASHMLA"): {"read": "call", "hot": False, "default": "1"},
    ("0.5.13", "--cuda-graph-max-bs"): {"kind": "arg", "where": "sglang/srt/server_args.py"},
    ("0.5.13", "--moe-runner-backend"): {"default": {"default": "auto", "sm120": "marlin"}},
}
# Not on DeepSeek-V4's path although the releases declare them.
ABSENT = ("SGLANG_HICACHE_HF3FS_CONFIG_PATH", "--lora-backend", "--mm-attention-backend",
          "--hicache-ratio")
UNRELATED = re.compile(r"LORA|HICACHE|MULTIMODAL|_MM_|^--(mm|lora|hicache)-", re.IGNORECASE)


def test_every_verified_release_ships_a_catalog() -> None:
    assert shipped_releases() == list(VERIFIED)


@pytest.mark.parametrize("release", VERIFIED)
def test_shipped_catalog_schema_counts_and_no_unrelated_switch(release: str) -> None:
    catalog = load_catalog(release)
    assert catalog.release == release
    rows = catalog.to_json()["switches"]
    for row in rows:
        assert SCHEMA <= set(row) <= SCHEMA | OPTIONAL, row
        assert row["tier"] in TIERS
        assert re.fullmatch(r"sglang/\S+\.py:\d+", row["where"]), row["where"]
        assert not row["hot"] or row["read"] == "call"
        for site in (*row.get("also", ()), *row.get("other_vendor", ())):  # every read site
            assert re.fullmatch(r"sglang/\S+\.py:\d+", site), site
        assert set(row.get("other_vendor", ())) <= {row["where"], *row.get("also", ())}
    assert (catalog.count("env"), catalog.count("arg")) == COUNTS[release]
    per_call = {s.name for s in catalog.switches if s.kind == "env" and s.read == "call"}
    hot = {s.name for s in catalog.switches if s.hot}
    assert (len(hot), len(per_call)) == HOT[release]
    assert hot == per_call & deliverable_env(release)  # hot: per call AND deliverable
    assert 40 <= len(rows) <= 200
    assert not [n for n in catalog.names() if UNRELATED.search(n)]
    assert not [n for n in ABSENT if n in catalog.names()]


@pytest.mark.parametrize(("release", "name"), sorted(KNOWN))
def test_known_entries(release: str, name: str) -> None:
    switch = load_catalog(release).by_name(name)
    for key, value in KNOWN[release, name].items():
        got = getattr(switch, key)
        if key == "where" and ":" not in value:
            got = got.split(":")[0]
        assert got == value, f"{release} {name}.{key}: {got!r} != {value!r}"


def test_releases_list_their_own_sets() -> None:
    old, new = set(load_catalog("0.5.13").names()), set(load_catalog("0.5.23").names())
    assert "SGLANG_SM120_FLASHMLA_BACKEND" in new - old
    assert "SGLANG_OPT_USE_TRITON_FUSED_MHC" in old - new
    assert len(new - old) >= 40


def test_hot_and_read_agree_with_every_patch_rule() -> None:
    """The built-in patches' upstream switches were verified by hand per release
    (`SglangRule.read_once`, `copies`): discovery must reach the same verdict."""
    checked = 0
    for release in VERIFIED:
        catalog, version = load_catalog(release), parse_version(release)
        for patch in builtin_patches().values():
            for arch in ARCHS:
                rule = patch.sglang.rule(version, arch)
                if rule is None or rule.how != "env":
                    continue
                for var in rule.variables:
                    switch = catalog.by_name(var)
                    assert switch.hot == (not rule.read_once), (release, patch.name, var)
                    for copy in rule.copies:
                        assert copy.target in switch.copies, (release, copy.target)
                    checked += 1
    assert checked >= 50


def test_by_name_takes_either_argument_spelling_and_says_what_is_close() -> None:
    catalog = load_catalog("0.5.23")
    assert catalog.by_name("kv_cache_dtype") == catalog.by_name("--kv-cache-dtype")
    with pytest.raises(ConfigError) as err:
        catalog.by_name("SGLANG_OPT_FP8_WO_A_GEM")
    assert "SGLANG_OPT_FP8_WO_A_GEMM" in (err.value.hint or "")
    with pytest.raises(ConfigError) as err:
        load_catalog("0.5.99")
    assert "--sglang-src" in (err.value.hint or "")


def test_default_for_an_architecture() -> None:
    switch = load_catalog("0.5.23").by_name("SGLANG_OPT_FP8_WO_A_GEMM")
    assert switch.default_for("sm120") is False
    assert switch.default_for("sm100") is True and switch.default_for(None) is True


@pytest.mark.parametrize(("name", "tier"), [
    ("SGLANG_OPT_FP8_WO_A_GEMM", "precision"), ("SGLANG_OPT_USE_TILELANG_INDEXER", "kernel"),
    ("--attention-backend", "kernel"), ("--enable-dp-attention", "topology"),
    ("--tp-size", "topology"), ("--chunked-prefill-size", "scheduling"),
    ("--disable-cuda-graph", "scheduling"), ("SGLANG_ENABLE_PRINT_TENSOR", "logging"),
    ("SGLANG_DSV4_KV_LAYOUT", "kernel"), ("SGLANG_SOMETHING_ELSE", "other"),
])
def test_tier_rule(name: str, tier: str) -> None:
    assert tier_of(name) == tier


def test_priors_weigh_kernel_and_precision_over_scheduling_and_logging() -> None:
    switches = [load_catalog("0.5.23").by_name(n) for n in (
        "SGLANG_OPT_FP8_WO_A_GEMM", "--tp-size", "--chunked-prefill-size", "--disable-cuda-graph")]
    logging = Switch(name="SGLANG_X_LOG", kind="env", type="bool", default=False, read="call",
                     hot=True, gates="f", where="sglang/x.py:1", tier="logging")
    weights = prior_weights([*switches, logging])
    assert sum(weights.values()) == pytest.approx(1.0)
    assert weights["SGLANG_OPT_FP8_WO_A_GEMM"] > weights["--tp-size"] > \
        weights["--chunked-prefill-size"] > weights["SGLANG_X_LOG"]


# --- against the wheels (downloaded once; skipped only when the index is unreachable) --------

@pytest.fixture(scope="module")
def tree(wheel) -> SourceTree:
    return SourceTree(wheel)


def test_shipped_data_is_the_discovery_on_the_wheel(tree: SourceTree) -> None:
    release = tree.version()
    found = discover(tree)
    assert dumps(found) == dumps(load_catalog(release)), \
        f"regenerate: python tests/benchmarks/gen_switch_catalog.py {release}"
    declared = env_declarations(tree)
    assert "SGLANG_HICACHE_HF3FS_CONFIG_PATH" in declared  # the absence below means something
    assert len(declared) > 300


def test_cli_reads_a_wheel(cli) -> None:
    from wheels import wheel_of

    got = cli("switches", "--sglang-src", str(wheel_of("0.5.23")), "--json")
    assert got.returncode == 0, got.stderr
    data = json.loads(got.stdout)
    names = {s["name"] for s in data["switches"]}
    assert data["release"] == "0.5.23" and 40 <= len(names) <= 200
    assert {"SGLANG_OPT_FP8_WO_A_GEMM", "SGLANG_OPT_USE_TILELANG_INDEXER",
            "SGLANG_OPT_FUSE_MHC_POST_PRE", "SGLANG_DSV4_FP4_EXPERTS"} <= names
