"""`engine.kind: vllm`: the argv of every shipped vLLM profile parses as each verified release's
own `vllm serve` (its options extracted from the wheel, shipped as facts), and every setting of
the SGLang kind has its vLLM meaning or a clear error."""

from __future__ import annotations

import pytest

from dsv4bisect.base import vllm_releases as vr
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.errors import ConfigError
from dsv4bisect.plugin.vllm.argcheck import check_argv

PROFILES = ("dsv4-flash-vllm-tp8", "dsv4-flash-vllm-tp8-latest-all")


def _argv(profile: str, *sets: str) -> list[str]:
    cfg = resolve(profile, Overrides(sets=sets))
    (proc,) = cfg.materialize({"server": 8000}, "python3")
    return list(proc.argv)


@pytest.mark.parametrize("release", vr.VERIFIED)
@pytest.mark.parametrize("profile", PROFILES)
def test_every_shipped_profile_parses_on_every_release(profile: str, release: str) -> None:
    argv = _argv(profile, f"engine.vllm_version={release}")
    assert argv[:5] == ["python3", "-m", "vllm.entrypoints.cli.main", "serve",
                        "/models/DeepSeek-V4-Flash"]
    assert check_argv(argv, vr.load_facts(release)) == []


def test_the_profiles_pin_the_first_and_the_newest_release() -> None:
    assert resolve(PROFILES[0]).identity["engine_version"] == {"vllm": "0.20.0"}
    latest = resolve(PROFILES[1])
    assert latest.identity["engine_version"] == {"vllm": "0.34.0"}
    delivered = {p.name: p.delivery for p in latest.patches if p.delivered}
    assert delivered["mhc-bf16"] == "hook" and delivered["mma-decode"] == "hook"
    assert delivered["nextn-speculation"].startswith("args --speculative-config")
    absent = {p.name: p.inert for p in latest.patches if not p.delivered}
    assert "SGLang environment switch" in absent["fp8-wo-a-gemm"]
    assert "upstream" in {p.delivery for p in latest.patches if p.name == "hash-topk-scaling"}
    env = latest.processes[0].env_dict()
    assert env["DSV4BISECT_PATCHES"] == "mhc-bf16,mma-decode,nvfp4-dispatch"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"  # /reset_prefix_cache for the probe


@pytest.mark.parametrize("argv,release,problem", [
    (["--attention-config.use_fp4_indexer_cache=true"], "0.34.0",
     "AttentionConfig has no field use_fp4_indexer_cache"),
    (["--attention-config", '{"indexer_kv_dtype": "mxfp4"}'], "0.22.0",
     "AttentionConfig has no field indexer_kv_dtype"),
    (["--moe-backend", "b12x"], "0.20.0", "'b12x' is not one of"),
    (["--tp", "2"], "0.34.0", "unknown option --tp"),
    (["--max-num-seqs", "many"], "0.34.0", "--max-num-seqs takes an integer"),
    (["--no-max-num-seqs"], "0.34.0", "is not a boolean option"),
    (["--enforce-eager=1"], "0.34.0", "--enforce-eager takes no value"),
    (["--speculative-config", '{"method": "mtp", "num_spec": 1}'], "0.34.0",
     "SpeculativeConfig has no field num_spec"),
])
def test_a_wrong_argument_is_named(argv: list[str], release: str, problem: str) -> None:
    problems = check_argv(["serve", "m", *argv], vr.load_facts(release))
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize("argv,release", [
    (["--attention-config.use_fp4_indexer_cache=true"], "0.20.0"),
    (["--attention-config.use_fp4_indexer_cache", "true"], "0.28.0"),  # the deprecated alias
    (["--attention-config.indexer_kv_dtype=mxfp4"], "0.34.0"),
    (["--attention_config.indexer_kv_dtype=mxfp4", "--max_num_seqs", "8"], "0.34.0"),
    (["-tp", "8", "--no-enable-prefix-caching", "--max-num-batched-tokens", "8k"], "0.34.0"),
    (["--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}'], "0.24.0"),
    (["-O3"], "0.20.0"),
])
def test_what_vllm_accepts_passes(argv: list[str], release: str) -> None:
    assert check_argv(["serve", "m", *argv], vr.load_facts(release)) == []


def test_the_sglang_settings_in_vllm_terms() -> None:
    argv = _argv(PROFILES[0], "engine.dp=2", "engine.disable_radix_cache=true",
                 "engine.quantization=fp8")
    text = " ".join(argv)
    assert "--data-parallel-size 2 --tensor-parallel-size 4 --enable-expert-parallel" in text
    assert "--no-enable-prefix-caching" in argv and "--enable-prompt-tokens-details" in argv
    assert "--max-num-batched-tokens 8192 --max-num-seqs 256" in text
    assert "--quantization fp8" in text
    cfg = resolve(PROFILES[0])
    assert cfg.processes[0].schedulers == 8  # one receipt per worker
    assert cfg.processes[0].ready_path == "/health"
    assert cfg.processes[0].env_dict()["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert check_argv(argv, vr.load_facts("0.34.0")) == []


def test_vllm_plugins_gets_ours_only_where_the_profile_sets_an_allowlist() -> None:
    cfg = resolve(PROFILES[0], Overrides(enable=("mhc-bf16",)))
    assert "VLLM_PLUGINS" not in cfg.processes[0].env_dict()  # unset: every plugin loads
    cfg = resolve(PROFILES[0], Overrides(enable=("mhc-bf16",),
                                         sets=("engine.env.VLLM_PLUGINS=lora",)))
    assert cfg.processes[0].env_dict()["VLLM_PLUGINS"] == "lora,dsv4bisect"


@pytest.mark.parametrize("sets,message", [
    (("engine.pd.prefill.gpus=[0]", "engine.pd.decode.gpus=[1]"), "the vllm kind does not"),
    (("engine.api=vllm",), "`api` is only valid with kind: reference"),
    (("engine.dp=3",), "tp (8) must be a multiple of dp (3)"),
])
def test_a_setting_vllm_has_no_meaning_for_is_a_clear_error(sets: tuple[str, ...],
                                                            message: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(PROFILES[0], Overrides(sets=sets))
    assert message in err.value.message


def test_vllm_version_belongs_to_the_vllm_kind() -> None:
    with pytest.raises(ConfigError) as err:
        resolve("reference", Overrides(sets=("engine.vllm_version=0.34.0",)))
    assert "only valid with kind: vllm" in err.value.message


def test_the_embedded_engine_serves_vllms_api_on_request() -> None:
    cfg = resolve("reference-all", Overrides(sets=("engine.api=vllm",)))
    (proc,) = cfg.processes
    assert proc.argv[-2:] == ("--api", "vllm") and proc.ready_path == "/health"
    assert resolve("reference-all").fingerprint != cfg.fingerprint  # another API: another run
    assert "--api" not in resolve("reference-all").processes[0].argv
