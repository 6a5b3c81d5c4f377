"""The embedded engine's PD profile: SGLang's and sglang-router's flag names, per-role patches,
the transfer settings as bisect candidates, and what the launcher and the checks make of them."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from dsv4bisect.bisect.config_question import config_question
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.engines.verify import verify_reference_patches
from dsv4bisect.env import PATCHES, PD_TRANSFER_FAULT, ROLE_PATCHES
from dsv4bisect.errors import ConfigError, ExitCode, PatchError
from dsv4bisect.reference.pd import router_args

WHEELS = Path.home() / ".cache" / "dsv4bisect" / "sglang-wheels"
SERVE_FLAGS = ("--disaggregation-mode", "--disaggregation-bootstrap-port",
               "--disaggregation-transfer-backend")


def _flags(argv: tuple[str, ...]) -> list[str]:
    return [a for a in argv if a.startswith("--")]


def test_reference_pd_runs_prefill_decode_and_the_router_with_sglangs_flags() -> None:
    cfg = resolve("reference-pd")
    assert cfg.entry_role == "router" and [p.role for p in cfg.processes] == [
        "prefill", "decode", "router"]
    assert {"prefill", "decode", "router", "bootstrap"} == cfg.port_names()
    sglang = resolve("dsv4-flash-pd8")
    for role in ("prefill", "decode"):
        ours = [f for f in _flags(cfg.process(role).argv) if f.startswith("--disaggregation")]
        theirs = [f for f in _flags(sglang.process(role).argv)
                  if f.startswith("--disaggregation")]
        assert ours == theirs
    # the router: sglang-router's arguments after the module, in the same order
    ours = _flags(cfg.process("router").argv)
    assert ours == _flags(sglang.process("router").argv)
    for name, boot in (("reference-pd", "{port:bootstrap}"), ("dsv4-flash-pd8", "8998")):
        cfg = resolve(name)  # both parse as sglang-router parses them
        ports = {n: 40000 + i for i, n in enumerate(sorted(cfg.port_names()))}
        router = {p.role: p for p in cfg.materialize(ports, "python")}["router"].argv
        args = router_args.parse(list(router[router.index("--pd-disaggregation"):]))
        want = ports["bootstrap"] if boot.startswith("{") else int(boot)
        assert args.prefill == ((f"http://127.0.0.1:{ports['prefill']}", want),)
        assert args.decode == (f"http://127.0.0.1:{ports['decode']}",)


@pytest.mark.skipif(not list(WHEELS.glob("sglang-0.5.13-*.whl")), reason="no SGLang wheel")
def test_the_serve_flags_are_sglang_server_arguments() -> None:
    wheel = sorted(WHEELS.glob("sglang-0.5.13-*.whl"))[0]
    with zipfile.ZipFile(wheel) as zf:
        source = zf.read("sglang/srt/server_args.py").decode()
    declared = set(re.findall(r'"(--disaggregation-[a-z-]+)"', source))
    assert set(SERVE_FLAGS) <= declared
    choices = re.search(r"DISAGG_TRANSFER_BACKEND_CHOICES = \[(.*?)\]", source, re.S)
    assert choices and {"mooncake", "nixl"} <= set(re.findall(r'"(\w+)"', choices.group(1)))


def test_router_arguments_are_parsed_as_sglang_router_parses_them() -> None:
    args = router_args.parse(["--pd-disaggregation", "--prefill", "http://a:1", "8998",
                              "--prefill", "http://b:2", "none", "--decode", "http://c:3",
                              "--decode", "http://d:4", "--policy", "round_robin"])
    assert args.prefill == (("http://a:1", 8998), ("http://b:2", None))
    assert args.decode == ("http://c:3", "http://d:4") and args.policy_of("decode") == \
        "round_robin"
    assert router_args.parse(["--pd-disaggregation", "--prefill", "http://a:1", "--decode",
                              "http://c:3"]).policy == "cache_aware"  # sglang-router's default
    for bad in (["--prefill", "http://a:1", "--decode", "http://c:3"],  # not PD
                ["--pd-disaggregation", "--decode", "http://c:3"],
                ["--pd-disaggregation", "--prefill", "a:1", "--decode", "http://c:3"],
                ["--pd-disaggregation", "--prefill", "http://a:1", "x", "--decode", "http://c"],
                ["--pd-disaggregation", "--policy", "fastest"]):
        with pytest.raises(ConfigError) as info:
            router_args.parse(bad)
        assert info.value.exit_code == ExitCode.BAD_INPUT and info.value.hint


def test_a_patch_can_be_on_one_role_only() -> None:
    cfg = resolve("reference-pd", Overrides(sets=(
        "engine.pd.decode.patches.mma-decode.variant=merge-no-rescale",)))
    env = {p.role: p.env_dict() for p in cfg.processes}
    assert env["decode"][PATCHES] == "mma-decode:merge-no-rescale"
    assert env["prefill"][PATCHES] == "" and cfg.patch_set == {}
    assert env["decode"][ROLE_PATCHES] == "mma-decode:merge-no-rescale"
    off = resolve("reference-pd", Overrides(enable=("mhc-bf16",),
                                            sets=("engine.pd.prefill.patches.mhc-bf16=false",)))
    env = {p.role: p.env_dict() for p in off.processes}
    assert env["prefill"][PATCHES] == "" and env["prefill"][ROLE_PATCHES] == "!mhc-bf16"
    assert env["decode"][PATCHES] == "mhc-bf16"
    assert off.fingerprint != resolve("reference-pd", Overrides(enable=("mhc-bf16",))).fingerprint
    # a required patch turned off on one role: that configuration cannot start
    sglang = resolve("dsv4-flash-pd8", Overrides(
        sets=("engine.pd.decode.patches.hash-topk-scaling=false",)))
    assert sglang.cannot_start and "decode" in sglang.cannot_start
    with pytest.raises(ConfigError, match="unknown patch `mma-decod`"):
        resolve("reference-pd", Overrides(sets=("engine.pd.decode.patches.mma-decod=true",)))


def test_the_transfer_fault_is_a_setting_of_the_embedded_pd_engine() -> None:
    cfg = resolve("reference-pd", Overrides(sets=("engine.pd.transfer_fault=state-not-sent",)))
    assert cfg.process("prefill").env_dict()[PD_TRANSFER_FAULT] == "state-not-sent"
    assert cfg.process("decode").env_dict()[PD_TRANSFER_FAULT] == "state-not-sent"
    for bad in (("reference-pd", "engine.pd.transfer_fault=state-not-snt"),
                ("dsv4-flash-pd8", "engine.pd.transfer_fault=state-not-sent"),
                ("reference-pd", "engine.pd.transfer_backend=mori")):
        with pytest.raises(ConfigError) as info:
            resolve(bad[0], Overrides(sets=(bad[1],)))
        assert info.value.exit_code == ExitCode.BAD_INPUT


def test_the_transfer_settings_and_a_role_patch_are_bisect_candidates(tmp_path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("schema_version: 1\nname: good\nextends: reference-pd\n"
                    "engine:\n  pd:\n    transfer_backend: nixl\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nname: bad\nextends: reference-pd\n"
                   "engine:\n  pd:\n    transfer_fault: state-not-sent\n"
                   "    decode:\n      patches: {mma-decode: true}\n"
                   "    router: {policy: random}\n")
    q = config_question(str(good), str(bad))
    assert set(q.candidates) == {"engine.pd.transfer_backend", "engine.pd.transfer_fault",
                                 "engine.pd.decode.patches.mma-decode", "engine.pd.router.policy"}
    assert q.bad["engine.pd.transfer_fault"] == '"state-not-sent"'


def test_each_pd_server_must_report_the_patch_set_it_was_sent() -> None:
    cfg = resolve("reference-pd", Overrides(sets=("engine.pd.decode.patches.mma-decode=true",)))
    info = {"prefill": [{"patches": {}}], "decode": [{"patches": {"mma-decode": "split-k"}}]}
    verify_reference_patches(cfg, info)
    info["decode"][0]["patches"] = {}
    with pytest.raises(PatchError, match="the decode server"):
        verify_reference_patches(cfg, info)


def test_run_judges_a_role_patch_against_the_pair_without_it() -> None:
    from dsv4bisect.run.ends import resolve_ends

    ends = resolve_ends("reference-pd", Overrides(sets=(
        "engine.pd.decode.patches.mma-decode=true", "engine.precision=exact")))
    wire = {cfg: {p.role: p.env_dict().get(PATCHES) for p in c.processes
                  if p.role != "router"} for cfg, c in (("good", ends.good),
                                                         ("candidate", ends.candidate))}
    assert wire == {"good": {"prefill": "", "decode": ""},
                    "candidate": {"prefill": "", "decode": "mma-decode"}}
    assert "--precision" in ends.good.process("decode").argv  # the other --set items stay
    assert ends.good.process("decode").argv == ends.candidate.process("decode").argv


def test_the_router_command_and_the_fault_listing(cli) -> None:
    done = cli("router", "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2")
    assert done.returncode == 5 and "only the PD mode" in done.stderr and "hint:" in done.stderr
    helped = cli("router", "--help")
    assert helped.returncode == 0 and "--pd-disaggregation" in helped.stdout
    shown = cli("patches", "show", "engine.pd.transfer_fault")
    assert shown.returncode == 0 and "sglang PR #24878" in shown.stdout
    assert "state-not-sent (FAULT, the mooncake backend only)" in shown.stdout
    listed = cli("patches", "list")
    assert "engine.pd.transfer_fault" in listed.stdout and "stale-slot" in listed.stdout


def test_an_sglang_switch_can_be_on_one_role_and_no_role_env_drives_it() -> None:
    cfg = resolve("dsv4-flash-pd8", Overrides(sets=(
        "engine.sglang_version=0.5.23", "engine.pd.decode.patches.fused-mhc-post-pre=true")))
    env = {p.role: p.env_dict() for p in cfg.processes}
    assert env["decode"]["SGLANG_OPT_FUSE_MHC_POST_PRE"] == "1"
    assert env["prefill"]["SGLANG_OPT_FUSE_MHC_POST_PRE"] == "0"  # its most exact value
    with pytest.raises(ConfigError, match="driven by the built-in patch"):
        resolve("dsv4-flash-pd8", Overrides(sets=(
            "engine.sglang_version=0.5.23",
            "engine.pd.decode.env.SGLANG_OPT_FUSE_MHC_POST_PRE=1")))
