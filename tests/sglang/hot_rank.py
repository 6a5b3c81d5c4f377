"""One SGLang scheduler rank in hot mode, as a process of its own (test_hot_switch.py).

`python hot_rank.py WHEEL RANK LAST_GENERATION OUT_DIR [sm120]`, with the engine env the launcher
would set (DSV4BISECT_PATCHES, _HOT, _SWITCH_DIR, _SWITCHES, _ROLE, _RECEIPTS). With `sm120` the
wheel's `flash_mla_sm120.py` is imported again against its own environ.py (so
`_sm120_default_backend` is read from the launch env, as at a real import) and the observation
is which backend SGLang's `flash_mla_with_kvcache_sm120` dispatches to. It builds the
synthetic sglang of the wheel (sglang_tree.py) plus the wheel's own Scheduler.flush_cache /
is_fully_idle and environ.py, runs the plugin's entry point inside a frame named like SGLang's
`run_scheduler_process` (so the plugin finds its TP rank as in a real scheduler), then plays the
scheduler's part: whenever the request file names a newer generation it calls `flush_cache()`
(what SGLang does on POST /flush_cache) and writes what the forward paths now do to
OUT_DIR/obs-g<g>-tp<rank>.json, until LAST_GENERATION.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parent))

import torch
from sglang_tree import (
    SglangTree,
    add_scheduler,
    decoder_layer,
    import_with_environ,
    make_hash_topk,
    make_scheduler,
    paged_decode_case,
    real_environ,
)

from dsv4bisect import env as envvars
from dsv4bisect.base.switching import read_request


def run_scheduler_process(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank,
                          dp_rank, pipe_writer):  # SGLang's signature: the plugin reads it
    from dsv4bisect.plugin.entry import PluginRefused, main

    try:
        main()
    except PluginRefused as exc:  # SGLang logs it and goes on; the receipts say why
        print(f"plugin refused: {exc}", file=sys.stderr)


def dist_info(wheel: str, site: Path) -> None:
    """The wheel's own dist-info on sys.path, so the plugin's importlib.metadata lookup finds
    this release (the package itself is the synthetic tree)."""
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.split("/")[0].endswith(".dist-info") and name.endswith("/METADATA"):
                (site / name).parent.mkdir(parents=True, exist_ok=True)
                (site / name).write_bytes(z.read(name))
    sys.path.insert(0, str(site))


def sm120_dispatch(mla, kw: dict, stock_out) -> dict:
    """Which backend the wheel's flash_mla_with_kvcache_sm120 took: the torch path runs here;
    FlashInfer and the Triton fallback are imported at their first call, which fails on this
    machine (no flashinfer; the Triton module is not in the synthetic tree) and names them."""
    try:
        out = mla.flash_mla_with_kvcache_sm120(**kw)[0]
    except ImportError as exc:
        name = exc.name or str(exc)
        took = ("flashinfer" if "flashinfer" in name else
                "triton" if "flash_mla_sm120_triton" in name else f"? ({name})")
        return {"dispatch": took, "torch_out_equal": None}
    return {"dispatch": "torch", "torch_out_equal": bool(torch.equal(out, stock_out))}


def main(wheel: str, rank: int, last: int, out: Path, sm120: bool = False) -> None:
    switch_dir = Path(os.environ[envvars.SWITCH_DIR])
    dist_info(wheel, out / f"site-tp{rank}")
    with SglangTree(wheel) as tree:
        add_scheduler(tree)
        environ = real_environ(tree.src)
        import sglang.srt.models.deepseek_v4 as v4
        from sglang.srt.layers.moe.hash_topk import HashTopK

        if not sm120:  # the hooks' paths (hc_pre, HashTopK) of the hook releases
            g = torch.Generator().manual_seed(0)
            x = torch.randn(9, 4, 64, generator=g).to(torch.bfloat16)
            hc = (x, torch.randn(24, 256, generator=g) * 0.06, torch.tensor([0.8, 1.1, 0.9]),
                  torch.randn(24, generator=g) * 0.1)
            layer = decoder_layer(v4.DeepseekV4DecoderLayer)
            topk = make_hash_topk(HashTopK, topk=6, num_experts=16, num_fused_shared_experts=0,
                                  vocab_size=64, routed_scaling_factor=1.5,
                                  apply_routed_scaling_factor_on_output=False)
            route = (torch.zeros(3, 8), torch.randn(3, 16, generator=g), torch.tensor([1, 2, 3]))
            stock_y = v4.DeepseekV4DecoderLayer.hc_pre(layer, *hc)[0]  # SGLang's own paths
            stock_w = topk(*route).topk_weights
        else:  # SGLang's SM120 decode, imported against the launch env
            from dsv4bisect.sglang_hooks.targets import mla_module

            mla = import_with_environ(tree, mla_module(tree.layout), environ)
            kw = paged_decode_case(B=2, H=8, n_swa=64, n_extra=32)
            stock_out = mla._sm120_sparse_decode_fwd(*(kw[k] for k in (
                "q", "k_cache", "indices", "topk_length", "attn_sink", "head_dim_v",
                "softmax_scale", "extra_k_cache", "extra_indices_in_kvcache",
                "extra_topk_length")))[0]

        run_scheduler_process(SimpleNamespace(tp_size=2, dp_size=1), None, rank, rank, 0, 0,
                              None, None)
        sched = make_scheduler(tree)
        runner = sched.tp_worker.model_runner

        def paths() -> dict:
            if sm120:
                return {"backend_global": mla._sm120_default_backend,
                        **sm120_dispatch(mla, kw, stock_out)}
            y = v4.DeepseekV4DecoderLayer.hc_pre(layer, *hc)[0]
            w = topk(*route).topk_weights
            return {"hc_pre_stock": bool(torch.equal(y, stock_y)),
                    "hc_pre_rel": float((y.float() - stock_y.float()).norm()
                                        / stock_y.float().norm()),
                    "hash_factor": float(w.sum() / stock_w.sum()),
                    "env_get": environ.envs.SGLANG_OPT_USE_FUSED_HASH_TOPK.get()}

        def observe(generation: int) -> None:
            path = out / f"obs-g{generation}-tp{rank}.json"
            path.with_suffix(".tmp").write_text(json.dumps({
                **paths(), "captures": runner.captures,
                "tree_resets": sched.tree_cache.calls.get("reset", 0)}))
            path.with_suffix(".tmp").rename(path)

        observe(0)
        seen, deadline = 0, time.monotonic() + 300
        while seen < last and time.monotonic() < deadline:
            req = read_request(switch_dir)
            if req is None or req.generation <= seen:
                time.sleep(0.02)
                continue
            sched.flush_cache()  # what POST /flush_cache reaches on every TP rank
            seen = req.generation
            observe(seen)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]),
         sm120=sys.argv[5:] == ["sm120"])
