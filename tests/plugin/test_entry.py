"""The plugin entry point as SGLang runs it: environment in, hooks and receipts out."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from types import SimpleNamespace

import pytest

from dsv4bisect import env as envvars
from dsv4bisect.errors import PatchError
from dsv4bisect.plugin.entry import PluginRefused, main
from dsv4bisect.plugin.context import current_process


def run_scheduler_process(server_args, port_args, gpu_id, tp_rank, attn_cp_rank, moe_dp_rank,
                          moe_ep_rank, pp_rank, dp_rank, pipe_writer):
    """Named and shaped like SGLang's scheduler entry, which calls load_plugins() first."""
    return main()


ARGS = SimpleNamespace(tp_size=8, dp_size=1, enable_dp_attention=False)


def test_no_patches_installs_nothing_and_imports_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(envvars.PATCHES, raising=False)
    monkeypatch.setenv(envvars.RECEIPTS, str(tmp_path))
    before = set(sys.modules)
    run_scheduler_process(ARGS, None, 3, 3, 0, 0, 3, 0, None, None)
    assert list(tmp_path.iterdir()) == []
    assert not {m for m in set(sys.modules) - before if m.startswith(("sglang", "torch"))}


def test_outside_a_scheduler_nothing_happens(tmp_path, monkeypatch):
    monkeypatch.setenv(envvars.PATCHES, "mhc-bf16")
    monkeypatch.setenv(envvars.RECEIPTS, str(tmp_path))
    main()  # the engine's main process: no model is built there
    assert list(tmp_path.iterdir()) == []


def test_without_sglang_every_patch_is_refused_with_a_receipt(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    if "sglang" in {d.metadata["Name"] for d in metadata.distributions()}:
        pytest.skip("SGLang is installed here")
    monkeypatch.setenv(envvars.PATCHES, "mhc-bf16,mma-decode:split-k-fp32")
    monkeypatch.setenv(envvars.RECEIPTS, str(tmp_path))
    monkeypatch.setenv(envvars.ROLE, "decode")
    with pytest.raises(PluginRefused, match="SGLang is not installed"):
        run_scheduler_process(ARGS, None, 5, 5, 0, 0, 5, 0, None, None)
    recs = {json.loads(p.read_text())["patch"]: json.loads(p.read_text())
            for p in tmp_path.glob("*.json")}
    assert set(recs) == {"mhc-bf16", "mma-decode"}
    r = recs["mma-decode"]
    assert (r["state"], r["variant"], r["process"]["role"], r["process"]["tp_rank"],
            r["process"]["gpu_id"]) == ("refused", "split-k-fp32", "decode", 5, 5)
    assert r["sglang_version"] is None and r["layout"] is None


def test_bad_wire_is_a_patch_error(monkeypatch):
    monkeypatch.setenv(envvars.PATCHES, "mhc-bf17")
    with pytest.raises(PatchError, match="unknown patch"):
        run_scheduler_process(ARGS, None, 0, 0, 0, 0, 0, 0, None, None)


def test_dp_attention_rank_is_derived_from_tp_rank():
    def run_scheduler_process(server_args, tp_rank, pp_rank, dp_rank, gpu_id):
        return current_process()

    args = SimpleNamespace(tp_size=8, dp_size=4, enable_dp_attention=True)
    p = run_scheduler_process(args, 5, 0, None, 5)
    assert (p.kind, p.tp_rank, p.dp_rank, p.tp_size, p.dp_size) == ("scheduler", 5, 2, 8, 4)


def test_plugin_imports_without_torch():
    code = ("import sys; import dsv4bisect.plugin.entry, dsv4bisect.plugin.install, "
            "dsv4bisect.plugin.static, dsv4bisect.engines.receipts; "
            "print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'sglang', 'triton')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_entry_point_is_registered_for_sglang():
    eps = metadata.entry_points(group="sglang.srt.plugins")
    ours = [ep for ep in eps if ep.name == "dsv4bisect"]
    assert ours, ("no `dsv4bisect` entry point in group sglang.srt.plugins: add it to "
                  "pyproject.toml and reinstall (pip install -e .)")
    assert ours[0].load() is main
