"""A stand-in `vllm` package at a release's hook layout, for the plugin's tests on this CPU.

vLLM does not import here (its torch pin, its CUDA libraries), so these tests write, into a
temporary directory, the modules the plugin touches with the names, signatures and by-value
imports the release's source has (checked against the shipped facts by tests/vllm/
test_targets.py): `plugins.load_general_plugins` (entry points of `vllm.general_plugins`,
VLLM_PLUGINS, `plugins_loaded`, the call outside any try: 0.34.0's code), the worker wrapper's
`init_worker` and the GPU worker's warm-up and step, the mHC kernels' module (whose kernels
raise: only a hook may run there), the routing function (the torch tail of 0.34.0's
`fused_topk_bias` for sigmoid scores, as vLLM's own fallback computes it), the model module
(imports them by value, calls them as vLLM's decoder layer and MoE block do) and the quant
config. A dist-info directory carries the release's version, as pip would.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

_FILES = {
    "vllm/__init__.py": "",
    "vllm/plugins/__init__.py": '''
        import os
        from importlib.metadata import entry_points

        DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"
        plugins_loaded = False


        def load_general_plugins():
            global plugins_loaded
            if plugins_loaded:
                return
            plugins_loaded = True
            allowed = os.environ.get("VLLM_PLUGINS")
            allowed = None if allowed is None else allowed.split(",")
            for plugin in entry_points(group=DEFAULT_PLUGINS_GROUP):
                if allowed is None or plugin.name in allowed:
                    plugin.load()()  # 0.34.0: called outside any try
    ''',
    "vllm/v1/__init__.py": "",
    "vllm/v1/worker/__init__.py": "",
    "vllm/v1/worker/worker_base.py": '''
        class WorkerWrapperBase:
            def __init__(self, rpc_rank=0):
                self.rpc_rank = rpc_rank
                self.worker = None

            def init_worker(self, all_kwargs):
                kwargs = all_kwargs[self.rpc_rank]
                from vllm.plugins import load_general_plugins

                load_general_plugins()
                from vllm.v1.worker.gpu_worker import Worker

                self.worker = Worker(**kwargs)
    ''',
    "vllm/v1/worker/gpu_worker.py": '''
        import torch


        class Worker:
            def __init__(self, vllm_config, local_rank, rank, **kwargs):
                from vllm.models.deepseek_v4.nvidia.model import DeepseekV4Model

                self.vllm_config, self.rank = vllm_config, rank
                self.model = DeepseekV4Model(vllm_config)

            def compile_or_warm_up_model(self):
                return self.model(torch.zeros(2, dtype=torch.long))

            def execute_model(self, scheduler_output):
                return self.model(scheduler_output)
    ''',
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/kernels/__init__.py": "",
    "vllm/model_executor/kernels/mhc/__init__.py": "",
    "vllm/model_executor/kernels/mhc/tilelang.py": '''
        def _no_kernel(*args, **kwargs):
            raise RuntimeError("TileLang kernel: not on this machine (only a hook may run)")


        def mhc_pre_tilelang(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps,
                             hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, n_splits=1,
                             norm_weight=None, norm_eps=1e-6):
            _no_kernel()


        def mhc_pre_broadcast_tilelang(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps,
                                       hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat,
                                       n_splits=1, norm_weight=None, norm_eps=1e-6,
                                       fn_broadcast=None):
            _no_kernel()


        def mhc_post_tilelang(x, residual, post_layer_mix, comb_res_mix):
            import torch  # vLLM's torch.py formula (the kernel's numerics, in fp32)

            mixed = torch.einsum("...ij,...ih->...jh", comb_res_mix.float(), residual.float())
            return (mixed + post_layer_mix.float() * x.unsqueeze(-2).float()).to(residual.dtype)


        def mhc_fused_post_pre_tilelang(x, residual, post_layer_mix, comb_res_mix, fn, hc_scale,
                                        hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                                        hc_post_mult_value, sinkhorn_repeat, n_splits=1,
                                        tile_n=1, norm_weight=None, norm_eps=1e-6):
            _no_kernel()


        def mhc_fused_post_pre_tilelang_reuse_residual(x, residual, post_layer_mix,
                                                       comb_res_mix, fn, hc_scale, hc_base,
                                                       rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                                                       hc_post_mult_value, sinkhorn_repeat,
                                                       n_splits=1, tile_n=1, norm_weight=None,
                                                       norm_eps=1e-6):
            _no_kernel()
    ''',
    "vllm/model_executor/layers/__init__.py": "",
    "vllm/model_executor/layers/fused_moe/__init__.py": "",
    "vllm/model_executor/layers/fused_moe/router/__init__.py": "",
    "vllm/model_executor/layers/fused_moe/router/fused_topk_bias_router.py": '''
        import torch


        def fused_topk_bias(hidden_states, gating_output, scoring_func, e_score_correction_bias,
                            topk, renormalize, indices_type=None, input_tokens=None,
                            hash_indices_table=None, routed_scaling_factor=1.0, bias_vl=None,
                            image_sentinel_lo=0):
            scores = gating_output.sigmoid()  # 0.34.0's torch tail
            if hash_indices_table is not None:
                topk_indices = hash_indices_table[input_tokens]
            else:
                topk_indices = torch.topk(scores + e_score_correction_bias, k=topk, dim=-1)[1]
            topk_weights = scores.gather(1, topk_indices)
            if renormalize:
                topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
            topk_weights = topk_weights.to(torch.float32)
            if routed_scaling_factor != 1.0:
                topk_weights *= routed_scaling_factor
            return topk_weights, topk_indices.to(torch.int32)
    ''',
    "vllm/models/__init__.py": "",
    "vllm/models/deepseek_v4/__init__.py": "",
    "vllm/models/deepseek_v4/quant_config.py": '''
        class Mxfp4MoEMethod:
            pass


        class DeepseekV4FP8Config:
            def get_quant_method(self, layer, prefix):
                return Mxfp4MoEMethod() if type(layer).__name__.endswith("MoE") else None
    ''',
    "vllm/models/deepseek_v4/nvidia/__init__.py": "",
    "vllm/models/deepseek_v4/nvidia/model.py": '''
        import torch

        from vllm.model_executor.kernels.mhc.tilelang import (
            mhc_fused_post_pre_tilelang,
            mhc_fused_post_pre_tilelang_reuse_residual,
            mhc_post_tilelang,
            mhc_pre_broadcast_tilelang,
            mhc_pre_tilelang,
        )
        from vllm.model_executor.layers.fused_moe.router.fused_topk_bias_router import (
            fused_topk_bias,
        )
        from vllm.models.deepseek_v4.quant_config import DeepseekV4FP8Config

        HC, D, E = 4, 64, 8
        LOG = []  # what the forward computed, read by the test


        class DeepseekV4MoE(torch.nn.Module):
            def __init__(self, vllm_config, prefix="", use_sequence_parallel=False):
                super().__init__()
                self.routed_scaling_factor = 1.5
                self.tid2eid = torch.arange(32 * 2).view(32, 2) % E
                self.quant_method = DeepseekV4FP8Config().get_quant_method(self, prefix)

            def forward(self, x, input_ids):
                logits = x.float() @ torch.linspace(-1, 1, D * E).view(D, E)
                return fused_topk_bias(x, logits, "sigmoid", None, 2, True,
                                       input_tokens=input_ids, hash_indices_table=self.tid2eid,
                                       routed_scaling_factor=self.routed_scaling_factor)


        class DeepseekV4DecoderLayer(torch.nn.Module):
            def __init__(self):
                super().__init__()
                g = torch.Generator().manual_seed(0)
                self.hc_attn_fn = torch.randn(2 * HC + HC * HC, HC * D, generator=g) * 0.02
                self.hc_attn_scale = torch.ones(3)
                self.hc_attn_base = torch.zeros(2 * HC + HC * HC)
                self.norm_weight = torch.ones(D, dtype=torch.bfloat16)
                self.ffn = DeepseekV4MoE(None)

            def forward(self, residual, input_ids):
                post, comb, x = mhc_pre_tilelang(
                    residual, self.hc_attn_fn, self.hc_attn_scale, self.hc_attn_base, 1e-6,
                    1e-6, 1e-6, 2.0, 20, norm_weight=self.norm_weight, norm_eps=1e-6)
                residual, post, comb, x = mhc_fused_post_pre_tilelang(
                    x, residual, post, comb, self.hc_attn_fn, self.hc_attn_scale,
                    self.hc_attn_base, 1e-6, 1e-6, 1e-6, 2.0, 20, n_splits=1, tile_n=1,
                    norm_weight=self.norm_weight, norm_eps=1e-6)
                weights, ids = self.ffn(x, input_ids)
                LOG.append((x, weights, ids))
                return mhc_post_tilelang(x, residual, post, comb)


        class DeepseekV4Model(torch.nn.Module):
            def __init__(self, vllm_config):
                super().__init__()
                self.layer = DeepseekV4DecoderLayer()

            def forward(self, input_ids):
                g = torch.Generator().manual_seed(int(input_ids.sum()))
                residual = torch.randn(input_ids.shape[0], HC, D, generator=g).bfloat16()
                return self.layer(residual, input_ids)
    ''',
}


def write(root: Path, version: str = "0.34.0", drop_copy: str | None = None) -> Path:
    """The package under `root` (put it first on sys.path); `drop_copy`: a name the model
    module no longer imports by value (a moved layout)."""
    for rel, text in _FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        body = textwrap.dedent(text).lstrip()
        if drop_copy and rel.endswith("nvidia/model.py"):
            body = body.replace(f"    {drop_copy},\n", "").replace(
                "import torch\n", f"import torch\nfrom vllm.model_executor.kernels.mhc import "
                f"tilelang as _t\n{drop_copy} = lambda *a, **k: _t.{drop_copy}(*a, **k)\n", 1)
        path.write_text(body)
    meta = root / f"vllm-{version}.dist-info"
    meta.mkdir(exist_ok=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return root
