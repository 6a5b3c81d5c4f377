"""Profiles: strict loading with positions, extends, overrides, shipped profiles."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsv4bisect.config.layering import builtin_names
from dsv4bisect.config.resolve import Overrides, load_profile, resolve
from dsv4bisect.errors import ConfigError, ExitCode, PatchError

BROKEN = Path(__file__).parents[1] / "data" / "broken"
SHIPPED = ["reference", "reference-all", "reference-pd", "dsv4-flash-tp8", "dsv4-flash-tp8-all",
           "dsv4-flash-pd8", "dsv4-flash-pd8-all", "dsv4-flash-tp8-latest",
           "dsv4-flash-tp8-latest-all", "dsv4-flash-vllm-tp8", "dsv4-flash-vllm-tp8-latest-all"]


def _expectation(path: Path) -> tuple[str, str]:
    first = path.read_text().splitlines()[0]
    m = re.match(r"# expect: (\d+:\d+) (.+)", first)
    assert m, f"{path} lacks an `# expect:` line"
    return m.group(1), m.group(2)


@pytest.mark.parametrize("path", sorted(BROKEN.glob("*.yaml")), ids=lambda p: p.stem)
def test_broken_profile_gives_one_positioned_error(path: Path) -> None:
    position, text = _expectation(path)
    with pytest.raises(ConfigError) as info:
        resolve(str(path))
    message = info.value.message
    assert info.value.exit_code == ExitCode.BAD_INPUT
    assert len(message.splitlines()) == 1, message
    assert re.match(r"^[\w./-]+\.yaml:\d+:\d+: ", message), message
    assert f".yaml:{position}: " in message, message
    assert text in message
    assert info.value.hint


def test_shipped_profiles_are_the_documented_set() -> None:
    assert builtin_names() == sorted(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_resolve_and_can_start(name: str) -> None:
    cfg = resolve(name)
    assert cfg.cannot_start is None
    assert len(cfg.fingerprint) == 16


def test_all_variants_enable_the_six_patches() -> None:
    for name in ("reference-all", "dsv4-flash-tp8-all", "dsv4-flash-pd8-all"):
        assert len(resolve(name).patch_set) == 6


def test_trtllm_clamp_is_inert_under_triton_and_required_patch_reported() -> None:
    cfg = resolve("dsv4-flash-tp8-all")
    by_name = {p.name: p for p in cfg.patches}
    assert by_name["trtllm-clamp"].inert and "TRT-LLM" in by_name["trtllm-clamp"].inert
    assert by_name["hash-topk-scaling"].required
    trt = resolve("dsv4-flash-tp8-all", Overrides(sets=("engine.moe_backend=flashinfer_trtllm",)))
    assert {p.name: p for p in trt.patches}["trtllm-clamp"].inert is None


def test_required_patch_off_means_cannot_start() -> None:
    cfg = resolve("dsv4-flash-tp8", Overrides(disable=("hash-topk-scaling",)))
    assert cfg.cannot_start and "hash-topk-scaling" in cfg.cannot_start


def test_hash_topk_default_inert_on_sglang_0_5_14_but_fault_is_not() -> None:
    sets = ("engine.sglang_version=0.5.14",)
    cfg = resolve("dsv4-flash-tp8", Overrides(sets=sets))
    assert cfg.patches[0].inert and cfg.cannot_start is None
    fault = resolve("dsv4-flash-tp8", Overrides(
        sets=sets + ("patches.hash-topk-scaling.variant=double-scale",)))
    assert fault.patches[0].fault and fault.patches[0].inert is None


def test_only_enable_disable() -> None:
    assert resolve("reference-all", Overrides(only=("mma-decode",))).patch_set == {
        "mma-decode": "split-k"}
    cfg = resolve("reference", Overrides(enable=("mhc-bf16",), disable=("mma-decode",)))
    assert cfg.patch_set == {"mhc-bf16": "bf16"}
    with pytest.raises(PatchError, match="unknown patch `mma-decod`"):
        resolve("reference", Overrides(enable=("mma-decod",)))
    with pytest.raises(PatchError):
        resolve("reference", Overrides(enable=("mhc-bf16",), disable=("mhc-bf16",)))


def test_set_variant_enables_the_patch_and_marks_faults() -> None:
    cfg = resolve("reference", Overrides(sets=("patches.hash-topk-scaling.variant=double-scale",)))
    assert cfg.patch_set == {"hash-topk-scaling": "double-scale"}
    assert cfg.patches[0].fault
    assert cfg.provenance["patches.hash-topk-scaling.variant"].startswith("--set ")


def test_set_is_type_checked_and_positioned_at_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"^--set engine.tp=eight: engine.tp: "):
        resolve("reference", Overrides(sets=("engine.tp=eight",)))


def test_provenance_names_file_positions_and_flags() -> None:
    cfg = resolve("reference-all", Overrides(sets=("engine.chunked_prefill_size=1024",)))
    assert cfg.provenance["patches.mhc-bf16.enabled"].startswith("builtin:reference-all.yaml:")
    assert cfg.provenance["engine.moe_backend"].startswith("builtin:reference.yaml:")
    assert cfg.provenance["engine.chunked_prefill_size"] == "--set engine.chunked_prefill_size=1024"
    assert cfg.provenance["engine.tp"] == "default"


def test_extends_chain_merges_mappings_and_replaces_lists(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text("schema_version: 1\nname: base\nengine:\n  kind: sglang\n  model: /m\n"
                    "  args: [--a, --b]\n  env: {X: '1', Y: '2'}\n")
    child = tmp_path / "child.yaml"
    child.write_text("schema_version: 1\nname: child\nextends: base.yaml\n"
                     "engine:\n  args: [--c]\n  env: {Y: '3'}\n")
    profile = load_profile(str(child)).profile
    assert profile.engine.args == ["--c"]
    assert profile.engine.env == {"X": "1", "Y": "3"}
    assert profile.engine.model == "/m"


def test_reference_precision_reaches_the_engine_argv_and_the_fingerprint() -> None:
    deployment = resolve("reference")
    exact = resolve("reference", Overrides(sets=("engine.precision=exact",)))
    argv = deployment.processes[0].argv
    assert argv[argv.index("--precision") + 1] == "deployment"
    assert "exact" in exact.processes[0].argv
    assert exact.fingerprint != deployment.fingerprint
    assert deployment.provenance["engine.precision"].startswith("builtin:reference.yaml:")
    with pytest.raises(ConfigError, match="precision"):
        resolve("reference", Overrides(sets=("engine.precision=fp4",)))
    with pytest.raises(ConfigError, match="only valid with kind: reference"):
        resolve("dsv4-flash-tp8", Overrides(sets=("engine.precision=exact",)))
