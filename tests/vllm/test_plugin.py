"""The vLLM plugin in worker processes: vLLM's plugin loader calls the entry point, the hooks
are installed at the release's sites with their by-value copies rebound, every worker writes
its receipts, the call evidence reaches them after the warm-up, and the launcher's check reads
them. vLLM cannot run here: the modules the plugin touches are stand-ins written at the 0.34.0
layout (tests/vllm/stand_in.py); the installer, the hooks and the receipts are the real ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest

from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.engines.receipts import check_receipts, read_receipts
from dsv4bisect.errors import PatchError

sys.path.insert(0, str(Path(__file__).parent))
import stand_in  # noqa: E402

WIRE = "mhc-bf16,hash-topk-scaling:double-scale,nvfp4-dispatch"

# vLLM's engine core loads the plugins, then forks its workers (they inherit
# plugins_loaded = True and never call the plugin themselves); each worker inits, warms up and
# runs one step. `spawn`: a worker process that loads the plugins itself inside init_worker.
DRIVER = textwrap.dedent('''
    import json, os, sys
    from types import SimpleNamespace
    import torch
    mode, out = sys.argv[1], sys.argv[2]

    def worker(rank):
        from vllm.v1.worker.worker_base import WorkerWrapperBase
        par = SimpleNamespace(tensor_parallel_size=2, data_parallel_size=1, data_parallel_rank=0)
        cfg = SimpleNamespace(parallel_config=par)
        w = WorkerWrapperBase(rpc_rank=rank)
        w.init_worker([{"vllm_config": cfg, "local_rank": r, "rank": r} for r in range(2)])
        w.worker.compile_or_warm_up_model()
        w.worker.execute_model(torch.tensor([3, 4, 5]))
        from vllm.models.deepseek_v4.nvidia import model
        x, weights, ids = model.LOG[-1]
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump({"weight_sums": weights.sum(-1).tolist(), "x_shape": list(x.shape),
                       "x_finite": bool(torch.isfinite(x.float()).all())}, f)

    if mode == "fork":
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        for rank in range(2):
            pid = os.fork()
            if pid == 0:
                worker(rank)
                os._exit(0)
            os.waitpid(pid, 0)
    else:
        worker(int(mode))
''')


def run_stand_in(tmp: Path, mode: str, wire: str = WIRE, version: str = "0.34.0",
         drop_copy: str | None = None, env_extra: Mapping[str, str] | None = None) -> Path:
    """Run DRIVER against the stand-in; `env_extra` is added (PYTHONPATH after the stand-in's
    root)."""
    root = stand_in.write(tmp / "site", version, drop_copy)
    receipts = tmp / "receipts"
    receipts.mkdir(exist_ok=True)
    extra = dict(env_extra or {})
    path = os.pathsep.join(filter(None, [str(root), extra.pop("PYTHONPATH", "")]))
    env = {"PYTHONPATH": path, "DSV4BISECT_PATCHES": wire, "PATH": "/usr/bin:/bin",
           "DSV4BISECT_RECEIPTS": str(receipts), "DSV4BISECT_ROLE": "server", **extra}
    got = subprocess.run([sys.executable, "-c", DRIVER, mode, str(tmp)], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert got.returncode == 0, got.stderr[-3000:]
    return receipts


def _config() -> object:
    return resolve("dsv4-flash-vllm-tp8", Overrides(
        sets=("engine.tp=2", "engine.gpus=[0,1]", "patches.hash-topk-scaling.variant=double-scale",
              "engine.vllm_version=0.34.0"), enable=("mhc-bf16", "nvfp4-dispatch")))


def test_forked_workers_install_and_the_launcher_accepts_their_receipts(tmp_path: Path) -> None:
    cfg = _config()
    assert cfg.processes[0].env_dict()["DSV4BISECT_PATCHES"] == WIRE
    receipts = run_stand_in(tmp_path, "fork")
    report = check_receipts(cfg, receipts)
    assert report.states == {p: {"server/tp0": "installed", "server/tp1": "installed"}
                             for p in ("mhc-bf16", "hash-topk-scaling", "nvfp4-dispatch")}
    recs = {(r["patch"], r["process"]["tp_rank"]): r for r in read_receipts(receipts)}
    mhc = recs[("mhc-bf16", 1)]
    assert mhc["engine"] == "vllm" and mhc["vllm_version"] == "0.34.0"
    assert mhc["layout"] == "0.34.0" and mhc["process"]["kind"] == "worker"
    # the model module's by-value copies were rebound (the kernels themselves raise here)
    assert "vllm.models.deepseek_v4.nvidia.model.mhc_pre_tilelang" in mhc["rebound"]
    # the model called two of the four hooked alternatives: the evidence is one of any
    assert set(mhc["called"]) == {"vllm.model_executor.kernels.mhc.tilelang.mhc_pre_tilelang",
                                  "vllm.model_executor.kernels.mhc.tilelang."
                                  "mhc_fused_post_pre_tilelang", *mhc["expects_call"]}
    assert mhc["expects_call"] == ["mHC pre (any of the hooked sites)"]
    dispatch = recs[("nvfp4-dispatch", 0)]["detail"]["quant_method"]
    assert dispatch[0]["method"] == "Mxfp4MoEMethod"
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        # double-scale: the stand-in's fused_topk_bias applied rsf 1.5 once, the fault again
        assert out["weight_sums"] == pytest.approx([2.25] * 3, rel=1e-6)
        assert out["x_shape"] == [3, 64] and out["x_finite"]


def test_a_worker_that_loads_the_plugin_itself_installs_too(tmp_path: Path) -> None:
    receipts = run_stand_in(tmp_path, "0", wire="mhc-bf16")
    (rec,) = read_receipts(receipts)
    assert rec["state"] == "installed" and rec["process"]["tp_rank"] == 0
    assert rec["called"], rec


def test_an_unverified_release_is_refused_in_every_worker(tmp_path: Path) -> None:
    receipts = run_stand_in(tmp_path, "fork", wire="mhc-bf16", version="0.19.0")
    recs = read_receipts(receipts)
    assert len(recs) == 2 and {r["state"] for r in recs} == {"refused"}
    assert "predates DeepSeek-V4 support" in recs[0]["reason"]
    cfg = resolve("dsv4-flash-vllm-tp8", Overrides(sets=("engine.tp=2", "engine.gpus=[0,1]"),
                                                   enable=("mhc-bf16",)))
    with pytest.raises(PatchError) as err:
        check_receipts(cfg, receipts)
    assert "mhc-bf16: refused in server tp0: vLLM 0.19.0 predates" in err.value.message


def test_a_model_module_without_the_by_value_copy_fails_the_patch(tmp_path: Path) -> None:
    receipts = run_stand_in(tmp_path, "0", wire="mhc-bf16",
                            drop_copy="mhc_fused_post_pre_tilelang")
    (rec,) = read_receipts(receipts)
    assert rec["state"] == "failed"
    assert "holds no by-value copy" in rec["reason"] and "layout changed" in rec["reason"]
