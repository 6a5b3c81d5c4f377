"""How each built-in patch reaches a given SGLang release: hooks, upstream switches (env), or
not at all — and the rules that keep a configuration honest (one switch, one patch; masks)."""

from __future__ import annotations

import pytest

from dsv4bisect.base.versions import VERIFIED, parse_version
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.errors import ConfigError
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.patchspec.spec import ARCHS

SWITCHES = "DSV4BISECT_SWITCHES"


def env_of(name: str, *sets: str, **kw) -> dict[str, str]:
    cfg = resolve(name, Overrides(sets=sets, **kw))
    return dict(cfg.process(cfg.entry_role).env)


def test_no_two_patches_drive_the_same_variable_on_any_release_or_gpu():
    for version in VERIFIED:
        for arch in ARCHS:
            owner: dict[str, str] = {}
            for p in builtin_patches().values():
                rule = p.sglang.rule(parse_version(version), arch)
                for var in rule.variables if rule else ():
                    assert owner.setdefault(var, p.name) == p.name, (version, arch, var)


def test_masks_name_real_patches_and_form_no_cycle():
    patches = builtin_patches()
    edges = {p.name: {m.by for m in p.masked_by} for p in patches.values()}
    assert all(b in patches for bs in edges.values() for b in bs)

    def reaches(a: str, b: str, seen: frozenset = frozenset()) -> bool:
        return any(n == b or (n not in seen and reaches(n, b, seen | {n})) for n in edges[a])

    assert not any(reaches(p, p) for p in edges)


def test_the_latest_profile_sets_every_switch_to_its_most_exact_path():
    env = env_of("dsv4-flash-tp8-latest")
    assert {k: env[k] for k in ("SGLANG_OPT_FUSE_MHC_POST_PRE", "SGLANG_OPT_USE_FLASHINFER_MHC",
                                "SGLANG_OPT_USE_TILELANG_INDEXER", "SGLANG_SM120_FLASHMLA_BACKEND",
                                "SGLANG_OPT_USE_FUSED_HASH_TOPK", "SGLANG_OPT_FP8_WO_A_GEMM")} \
        == {"SGLANG_OPT_FUSE_MHC_POST_PRE": "0", "SGLANG_OPT_USE_FLASHINFER_MHC": "0",
            "SGLANG_OPT_USE_TILELANG_INDEXER": "0", "SGLANG_SM120_FLASHMLA_BACKEND": "torch",
            "SGLANG_OPT_USE_FUSED_HASH_TOPK": "0", "SGLANG_OPT_FP8_WO_A_GEMM": "0"}
    assert "DSV4BISECT_PATCHES" not in env or env["DSV4BISECT_PATCHES"] == "hash-topk-scaling"


def test_the_latest_all_profile_has_six_candidates_each_delivered_by_its_switch():
    cfg = resolve("dsv4-flash-tp8-latest-all")
    active = [p for p in cfg.patches if p.inert is None]
    assert len(active) >= 6 and all(p.delivery.startswith("env ") for p in active)
    env = dict(cfg.process("server").env)
    for p in active:
        for pair in p.delivery.removeprefix("env ").split():
            var, value = pair.split("=")
            assert env[var] == value and f"{var}={value}" in env[SWITCHES]
    masked = {p.name: p for p in cfg.patches if not p.delivered}
    assert set(masked) >= {"mhc-bf16", "triton-indexer"}
    assert "masked by fused-mhc-post-pre" in masked["mhc-bf16"].inert
    assert not set(masked) & set(env["DSV4BISECT_PATCHES"].split(","))


def test_a_hook_masks_the_switch_it_replaces_and_its_off_value_is_set():
    env = env_of("dsv4-flash-tp8-latest-all", enable=("mma-decode",))
    cfg = resolve("dsv4-flash-tp8-latest-all", Overrides(enable=("mma-decode",)))
    backend = next(p for p in cfg.patches if p.name == "sm120-flashmla-backend")
    assert not backend.delivered and "masked by mma-decode" in backend.inert
    assert env["SGLANG_SM120_FLASHMLA_BACKEND"] == "torch"  # off, so the hook sees a stock path
    assert "mma-decode" in env["DSV4BISECT_PATCHES"]


def test_a_masked_patch_masks_nothing():
    """mhc-bf16 masked by the fused mHC does not keep flashinfer-mhc from acting."""
    cfg = resolve("dsv4-flash-tp8-latest-all")
    assert next(p for p in cfg.patches if p.name == "flashinfer-mhc").inert is None


@pytest.mark.parametrize("version,how", [("0.5.14", "absent"), ("0.5.17", "upstream"),
                                         ("0.5.20", "env")])
def test_a_switch_follows_what_the_release_lets_us_do(version, how):
    cfg = resolve("dsv4-flash-tp8-latest-all", Overrides(sets=(f"engine.sglang_version={version}",)))
    tilelang = next(p for p in cfg.patches if p.name == "tilelang-indexer")
    flashmla = next(p for p in cfg.patches if p.name == "sm120-flashmla-backend")
    if how == "absent":
        assert flashmla.delivery == "absent" and not flashmla.delivered and flashmla.inert
    if how == "upstream":
        assert tilelang.delivery == "upstream" and "unconditionally" in tilelang.inert
        assert "SGLANG_OPT_USE_TILELANG_INDEXER" not in dict(cfg.process("server").env)
    if how == "env":
        assert tilelang.delivery == "env SGLANG_OPT_USE_TILELANG_INDEXER=1"


def test_neither_engine_env_nor_a_custom_patch_may_drive_a_switch_a_patch_owns(tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text("schema_version: 1\nname: p\nextends: dsv4-flash-tp8-latest\n"
                    "engine:\n  env:\n    SGLANG_OPT_FUSE_MHC_POST_PRE: '1'\n")
    with pytest.raises(ConfigError, match="fused-mhc-post-pre") as exc:
        resolve(str(prof))
    assert "p.yaml" in exc.value.message and "patches" in exc.value.hint
    prof.write_text("schema_version: 1\nname: p\nextends: dsv4-flash-tp8-latest\n"
                    "custom_patches:\n  mine:\n    summary: s\n    env:\n"
                    "      SGLANG_OPT_USE_TILELANG_INDEXER: '0'\n")
    with pytest.raises(ConfigError, match="tilelang-indexer"):
        resolve(str(prof))


def test_the_opt_in_for_an_unverified_release_reaches_the_engine():
    env = env_of("dsv4-flash-tp8-latest", "engine.allow_unverified_sglang=true")
    assert env["DSV4BISECT_ALLOW_UNVERIFIED_SGLANG"] == "1"
    assert "DSV4BISECT_ALLOW_UNVERIFIED_SGLANG" not in env_of("dsv4-flash-tp8-latest")


@pytest.mark.slow  # plans of the standard tier: ~1 min of simulation on 2 cores (issue 42's 400 runs)
def test_the_plan_lists_each_candidate_with_its_delivery():
    from typer.testing import CliRunner

    from dsv4bisect.cli import app

    res = CliRunner().invoke(app, ["bisect", "dsv4-flash-tp8-latest-all", "--plan"])
    assert res.exit_code == 0, res.output
    assert "candidates (6)" in res.stderr
    assert "fused-mhc-post-pre: env SGLANG_OPT_FUSE_MHC_POST_PRE=1" in res.stderr


def test_the_docs_hold_the_generated_table():
    from pathlib import Path

    from dsv4bisect.patching.matrix import markdown

    doc = (Path(__file__).parents[2] / "docs" / "sglang.md").read_text()
    assert markdown() in doc, "regenerate: dsv4bisect patches matrix > the table in docs/sglang.md"
