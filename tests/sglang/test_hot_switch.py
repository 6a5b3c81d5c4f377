"""Hot switching against the wheels' own classes (CPU): two scheduler ranks in two processes
(hot_rank.py) run the real plugin in hot mode; the driver side is the real
`dsv4bisect.base.switching`. Each rank calls the wheel's own `Scheduler.flush_cache`
(extracted from the release, wrapped by the plugin) when a request appears, as SGLang does on
POST /flush_cache; capturing CUDA graphs needs a GPU and a built model, so the ModelRunner is a
stand-in carrying the release's verified re-capture entry (test_hot_static.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from sglang_tree import real_environ

from dsv4bisect import env as envvars
from dsv4bisect.base.switching import expected_receipts, wait_receipts, write_request
from dsv4bisect.base.versions import VERIFIED, parse_version
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.errors import EngineError
from dsv4bisect.plugin.graphs import hot_server_args
from dsv4bisect.plugin.static import SourceTree

RANKS = 2
EXPECTED = {("server", r) for r in range(RANKS)}
SWITCH = "SGLANG_OPT_USE_FUSED_HASH_TOPK"  # per-call on every release (hash_topk.py forward)


def _wait_file(path: Path, timeout_s: float = 60, procs: list | None = None) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never written"
        assert not any(p.poll() for p in procs or ()), f"a rank exited before {path.name}"
        time.sleep(0.02)
    return json.loads(path.read_text())


def _ranks(wheel: Path, tmp: Path, launch: str, hot: str, last: list[int],
           switches: dict[str, str] | None = None, *args: str):
    switches = switches or {SWITCH: "0"}  # what the launcher sets and lists for the base
    env = dict(os.environ, **{
        envvars.PATCHES: launch, envvars.HOT: hot, envvars.SWITCH_DIR: str(tmp / "switch"),
        envvars.RECEIPTS: str(tmp / "receipts"), envvars.ROLE: "server",
        envvars.SWITCHES: ",".join(f"{k}={v}" for k, v in switches.items())}, **switches)
    script = Path(__file__).with_name("hot_rank.py")
    return [subprocess.Popen([sys.executable, str(script), str(wheel), str(r), str(last[r]),
                              str(tmp), *args], env=env, stderr=subprocess.PIPE, text=True)
            for r in range(RANKS)]


@contextmanager
def _running(procs: list):
    """The rank processes: killed, with their stderr shown, if the body fails; else each must
    exit 0."""
    try:
        yield procs
    except BaseException:
        for p in procs:
            p.kill()
            print(p.communicate()[1][-3000:], file=sys.stderr)
        raise
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err[-3000:]


def test_a_switch_applies_on_every_rank_and_is_refused_for_a_load_time_patch(hook_wheel,
                                                                             tmp_path):
    version = hook_wheel.name.split("-")[1]
    double = parse_version(version) >= (0, 5, 14)  # hash-topk-scaling has no __init__ hook
    hot = "mhc-bf16,fused-hash-topk" + (",hash-topk-scaling:double-scale" if double else "")
    with _running(_ranks(hook_wheel, tmp_path, "mhc-bf16", hot, last=[4, 3])):
        d = tmp_path / "switch"
        obs0 = [_wait_file(tmp_path / f"obs-g0-tp{r}.json", 180) for r in range(RANKS)]
        assert all(not o["hc_pre_stock"] and 1e-6 < o["hc_pre_rel"] < 3e-2 for o in obs0)
        assert all(o["env_get"] is False and o["hash_factor"] == 1.0 for o in obs0)
        launch = {p.stem.split("--")[1]: json.loads(p.read_text())
                  for p in (tmp_path / "receipts").glob("server-tp0-*.json")}
        assert launch["mhc-bf16"]["state"] == "installed"
        assert launch["hot-switch"]["state"] == "installed", launch["hot-switch"]["reason"]

        # generation 1: mhc-bf16 off, SGLang's own fused-hash-topk switch (and double-scale) on
        wire = "hash-topk-scaling:double-scale,fused-hash-topk" if double else "fused-hash-topk"
        write_request(d, 1, wire)
        recs = wait_receipts(d, 1, EXPECTED, 120)
        assert [(r["role"], r["tp_rank"], r["ok"], r["graphs"], r["patches"]) for r in recs] == [
            ("server", 0, True, "recaptured", wire), ("server", 1, True, "recaptured", wire)]
        assert all(r["env"] == {SWITCH: "1"} for r in recs)
        obs = [_wait_file(tmp_path / f"obs-g1-tp{r}.json") for r in range(RANKS)]
        assert all(o["hc_pre_stock"] for o in obs)  # the gate calls SGLang's original
        assert all(o["env_get"] is True for o in obs)  # envs.X.get() follows os.environ
        assert all(o["hash_factor"] == (1.5 if double else 1.0) for o in obs)
        assert all(o["captures"] == 1 and o["tree_resets"] == 1 for o in obs)

        # generation 2: back to the launch set
        write_request(d, 2, "mhc-bf16")
        recs = wait_receipts(d, 2, EXPECTED, 60)
        assert all(r["patches"] == "mhc-bf16" and r["env"] == {SWITCH: "0"} for r in recs)
        obs = [_wait_file(tmp_path / f"obs-g2-tp{r}.json") for r in range(RANKS)]
        assert all(o["hc_pre_rel"] == obs0[0]["hc_pre_rel"] for o in obs)  # the bf16 path again
        assert all(o["env_get"] is False and o["hash_factor"] == 1.0 for o in obs)
        assert all(o["captures"] == 2 and o["tree_resets"] == 2 for o in obs)

        # generation 3: a load-time patch cannot be switched in: refused, nothing changes
        write_request(d, 3, "mhc-bf16,nvfp4-dispatch")
        with pytest.raises(EngineError, match=r"switch 3 refused by server tp\d: "
                                              r"nvfp4-dispatch:hybrid: decided at load time"):
            wait_receipts(d, 3, EXPECTED, 60)
        obs = [_wait_file(tmp_path / f"obs-g3-tp{r}.json") for r in range(RANKS)]
        assert all(o["hc_pre_rel"] == obs0[0]["hc_pre_rel"] and o["captures"] == 2 for o in obs)

        # generation 4: rank 1 has stopped; every rank's receipt is required
        write_request(d, 4, "fused-hash-topk")
        _wait_file(d / "receipt-g4-server-tp0.json")
        with pytest.raises(EngineError, match=r"switch 4: no receipt from server tp1 within 3 s"):
            wait_receipts(d, 4, EXPECTED, 3)


MLA_VAR = "SGLANG_SM120_FLASHMLA_BACKEND"
# Both homes of flash_mla_sm120.py (0.5.15 srt/layers/attention, 0.5.16+ kernels/ops) and the
# newest release, whose deepseek_v4.py also reads the variable per call.
MLA_VERSIONS = ("0.5.15", "0.5.16", VERIFIED[-1])  # all in wheels.FAST_VERSIONS


@pytest.mark.parametrize("version", MLA_VERSIONS)
def test_sm120_backend_switches_its_import_time_global_on_every_rank(version, tmp_path):
    """sm120-flashmla-backend is hot: after a switch every rank's `_sm120_default_backend` (the
    wheel's module global, set at import from the launch env) holds the new backend, the
    wheel's own `flash_mla_with_kvcache_sm120` dispatches to it, and the receipt says so;
    fused-mhc-post-pre (read once per decoder layer) is refused by name."""
    from wheels import wheel_of

    wheel = wheel_of(version)
    module = ("sglang.srt.layers.attention" if version == "0.5.15"
              else "sglang.kernels.ops.attention") + ".flash_mla_sm120._sm120_default_backend"
    with _running(_ranks(wheel, tmp_path, "", "sm120-flashmla-backend", [4, 4],
                         {MLA_VAR: "torch"}, "sm120")) as procs:
        d = tmp_path / "switch"
        obs = [_wait_file(tmp_path / f"obs-g0-tp{r}.json", 180, procs) for r in range(RANKS)]
        assert all(o["backend_global"] == "torch" and o["dispatch"] == "torch"
                   and o["torch_out_equal"] for o in obs)  # the launch env, read at import
        hot = json.loads(next((tmp_path / "receipts").glob(
            "server-tp0-*--hot-switch.json")).read_text())
        assert hot["state"] == "installed", hot["reason"]

        for gen, wire, backend in ((1, "sm120-flashmla-backend", "flashinfer"),
                                   (2, "sm120-flashmla-backend:triton", "triton"),
                                   (3, "", "torch")):
            write_request(d, gen, wire)
            recs = wait_receipts(d, gen, EXPECTED, 120)
            assert [(r["tp_rank"], r["ok"], r["graphs"], r["patches"]) for r in recs] == [
                (0, True, "recaptured", wire), (1, True, "recaptured", wire)]
            assert all(r["env"] == {MLA_VAR: backend} for r in recs)
            assert all(r["copies"] == {module: repr(backend)} for r in recs)
            obs = [_wait_file(tmp_path / f"obs-g{gen}-tp{r}.json") for r in range(RANKS)]
            assert all(o["backend_global"] == backend and o["dispatch"] == backend
                       and o["captures"] == gen for o in obs), obs
        assert all(o["torch_out_equal"] for o in obs)  # off again: SGLang's torch decode

        # a switch the release decides at load time: refused by name, nothing changes
        write_request(d, 4, "fused-mhc-post-pre")
        with pytest.raises(EngineError, match=r"switch 4 refused by server tp\d: "
                                              r"fused-mhc-post-pre:fused: decided at load time"):
            wait_receipts(d, 4, EXPECTED, 60)
        # the wait ends at the first refusal; the other rank's receipt may still be on its way
        recs = [_wait_file(d / f"receipt-g4-server-tp{r}.json") for r in range(RANKS)]
        assert all(not r["ok"] and "fused-mhc-post-pre" in r["error"] for r in recs)
        obs = [_wait_file(tmp_path / f"obs-g4-tp{r}.json") for r in range(RANKS)]
        assert all(o["backend_global"] == "torch" and o["captures"] == 3 for o in obs)


def test_expected_receipts_cover_every_scheduler_of_every_server():
    tp8 = resolve("dsv4-flash-tp8", Overrides())
    assert expected_receipts(tp8) == {("server", r) for r in range(8)}
    pd = resolve("dsv4-flash-pd8", Overrides())
    roles = {role for role, _ in expected_receipts(pd)}
    assert roles == {"prefill", "decode"}  # the router runs no engine code
    assert len(expected_receipts(pd)) == sum(p.schedulers for p in pd.processes)
    assert expected_receipts(resolve("reference", Overrides())) == {("server", 0)}


def test_hot_engines_keep_the_deployments_graph_mode_on_every_verified_release():
    assert all(hot_server_args(v) == () for v in VERIFIED)
    assert hot_server_args("0.5.12") == ("--disable-cuda-graph",)


def test_an_env_switch_is_read_at_every_call_by_the_releases_environ(wheel):
    """`envs.X.get()` of the wheel's own environ.py follows os.environ after import."""
    environ = real_environ(SourceTree(wheel))
    old = os.environ.get(SWITCH)
    try:
        os.environ[SWITCH] = "0"
        assert environ.envs.SGLANG_OPT_USE_FUSED_HASH_TOPK.get() is False
        os.environ[SWITCH] = "1"
        assert environ.envs.SGLANG_OPT_USE_FUSED_HASH_TOPK.get() is True
    finally:
        os.environ.pop(SWITCH) if old is None else os.environ.__setitem__(SWITCH, old)
