"""A minimal `sglang` package in sys.modules, built from a downloaded wheel's own source.

SGLang cannot be imported here (it needs CUDA libraries and dozens of dependencies), but the
pieces the hooks touch are plain Python. This helper loads them from the wheel at test time:
whole files where they import only the standard library and torch (`hook_registry.py`,
`flash_mla_sm120.py`), and otherwise single classes or functions extracted by AST
(`HashTopK`, `DeepseekV4DecoderLayer.hc_pre`, `fp8_paged_mqa_logits_torch_sm120`, …), executed
in a namespace that provides what their SGLang imports would (flags off, identity maps, the
NamedTuple they return). The only op supplied here is `hc_split_sinkhorn`, a TileLang GPU
kernel: `sinkhorn_torch` below is its torch transcription and serves both sides of every
comparison (SGLang's `hc_pre` and the hook call it the same way). Nothing from the wheel is
written to disk.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import math
import os
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from dsv4bisect.plugin.static import SourceTree


class Flag:
    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


class Envs(SimpleNamespace):
    """Stand-in for `sglang.srt.environ.envs`: every flag read by the extracted code is off
    (the torch paths), unless set."""

    def __getattr__(self, name: str) -> Flag:
        return Flag(False)


class StandardTopKOutput(NamedTuple):  # the fields of sglang.srt.layers.moe.topk's type
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor
    router_logits: torch.Tensor


def sinkhorn_torch(mixes: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                   hc_mult: int = 4, sinkhorn_iters: int = 20, eps: float = 1e-6
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch transcription of SGLang's TileLang `hc_split_sinkhorn` kernel.
    mixes [b, s, (2+n)·n] fp32 -> pre [b, s, n], post [b, s, n], comb [b, s, n, n]."""
    n = hc_mult
    m = mixes.float()
    pre = torch.sigmoid(m[..., :n] * hc_scale[0] + hc_base[:n]) + eps
    post = 2 * torch.sigmoid(m[..., n:2 * n] * hc_scale[1] + hc_base[n:2 * n])
    c = (m[..., 2 * n:] * hc_scale[2] + hc_base[2 * n:]).unflatten(-1, (n, n))
    c = torch.exp(c - c.amax(-1, keepdim=True))
    c = c / c.sum(-1, keepdim=True) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(sinkhorn_iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return pre, post, c


def extract(source: str, names: list[str], within: str | None = None) -> str:
    """Source of the named top-level (or `within`-class) definitions, decorators included."""
    tree = ast.parse(source)
    body = tree.body
    if within is not None:
        cls = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == within)
        body = cls.body
    parts = []
    for name in names:
        node = next((n for n in body if getattr(n, "name", None) == name
                     or any(getattr(t, "id", None) == name for t in getattr(n, "targets", []))),
                    None)
        if node is None:
            raise KeyError(f"{name} not found in the wheel source")
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        lines = source.splitlines()[start - 1: node.end_lineno]
        indent = len(lines[0]) - len(lines[0].lstrip())
        parts.append("\n".join(line[indent:] for line in lines))
    return "\n\n".join(parts) + "\n"


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


BASE = {"torch": torch, "nn": nn, "F": F, "Optional": Optional, "Tuple": Tuple, "Any": Any,
        "math": math, "logging": __import__("logging")}


class SglangTree:
    """Context manager: puts the synthetic `sglang` modules into sys.modules, then removes
    them (and anything imported under `sglang`) on exit."""

    def __init__(self, wheel: str | Path) -> None:
        self.src = SourceTree(wheel)
        self.version = self.src.version()
        self.modules: dict[str, types.ModuleType] = {}

    def __enter__(self) -> SglangTree:
        if any(m == "sglang" or m.startswith("sglang.") for m in sys.modules):
            raise RuntimeError("a real or synthetic sglang is already imported")
        try:
            self._build()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            del sys.modules[name]

    def _add(self, name: str, mod: types.ModuleType) -> types.ModuleType:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            cur = ".".join(parts[:i])
            if i == len(parts):
                self.modules[cur] = mod
            elif cur not in self.modules:
                self.modules[cur] = _module(cur, __path__=[])
            sys.modules[cur] = self.modules[cur]  # later extracted code imports it
            if i > 1:
                setattr(self.modules[".".join(parts[:i - 1])], parts[i - 1], self.modules[cur])
        return mod

    def _exec(self, name: str, code: str, ns: dict[str, Any]) -> types.ModuleType:
        mod = self._add(name, _module(name))
        mod.__dict__.update(BASE, **ns)
        # A name inspect.getsource can resolve through linecache (Triton's @jit reads the
        # source of the kernels SGLang defines, 0.5.16+), on no real path: nothing is written.
        filename = f"/{self.src.root.name}/{name.replace('.', '/')}.py"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        mod.__file__ = filename
        exec(compile(code, filename, "exec"), mod.__dict__)
        return mod

    def whole(self, name: str) -> types.ModuleType:
        src = self.src.source(name)
        assert src is not None, name
        return self._exec(name, src, {"__name__": name})

    def _build(self) -> None:
        from dsv4bisect.base.versions import check_version
        from dsv4bisect.sglang_hooks.targets import fused_guard_target, mla_module, sinkhorn_target

        self.layout = check_version(self.version or "", allow_unverified=True).layout or ""
        self.whole("sglang.srt.plugins.hook_registry")
        # What the newer extracted code imports: the env flags (all off: the torch paths, and
        # SGLang's pure-torch SM120 decode), platform probes (all false).
        self._add("sglang.srt.environ", _module("sglang.srt.environ", envs=Envs(
            SGLANG_SM120_FLASHMLA_BACKEND=Flag("torch"))))
        self._add("sglang.srt.utils", _module("sglang.srt.utils", is_hip=lambda: False,
                                              is_npu=lambda: False, is_xpu=lambda: False))
        old = os.environ.get("SGLANG_SM120_TRITON_FLASHMLA")
        os.environ["SGLANG_SM120_TRITON_FLASHMLA"] = "0"  # 0.5.13/0.5.14: the pure-torch path
        try:
            self.whole(mla_module(self.layout))
        finally:
            if old is None:
                os.environ.pop("SGLANG_SM120_TRITON_FLASHMLA")
            else:
                os.environ["SGLANG_SM120_TRITON_FLASHMLA"] = old
        self._add(sinkhorn_target(self.layout).rsplit(".", 1)[0], _module(
            sinkhorn_target(self.layout).rsplit(".", 1)[0], hc_split_sinkhorn=sinkhorn_torch,
            mhc_combine=mhc_combine_torch))
        server_args = SimpleNamespace(enable_deepep_waterfill=False)
        self._add("sglang.srt.server_args", _module(
            "sglang.srt.server_args", get_global_server_args=lambda: server_args))
        self._add("sglang.srt.runtime_context", _module(  # 0.5.16+: read at call time
            "sglang.srt.runtime_context", get_server_args=lambda: server_args))
        self._hash_topk()
        self._indexer()
        self._deepseek_v4(fused_guard_target(self.layout))
        self._add("sglang.srt.models.deepseek_v2", _module("sglang.srt.models.deepseek_v2",
                                                          DeepseekV2MoE=make_deepseek_v2_moe()))

    def _hash_topk(self) -> None:
        name = "sglang.srt.layers.moe.hash_topk"
        shared = SimpleNamespace(use_waterfill=False, num_shared_topk_slots=0)
        ns = dict(envs=Envs(), StandardTopKOutput=StandardTopKOutput,
                  ExpertLocationDispatchInfo=object,
                  topk_ids_logical_to_physical=lambda ids, info, *rest: ids,
                  _mask_topk_ids_padded_region=lambda *a: None,
                  _zero_topk_weights_padded_region=lambda *a: None,
                  get_global_expert_distribution_recorder=lambda: SimpleNamespace(
                      on_select_experts=lambda **k: None),
                  is_hip=lambda: False, is_npu=lambda: False, _is_hip=False, _is_npu=False,
                  _is_xpu=False, _RENORMALIZE_SUM_EPSILON=1e-20,
                  # 0.5.23: HashTopK reads the runtime context and the routing inputs
                  get_flags=lambda: SimpleNamespace(moe=SimpleNamespace(
                      in_speculative_scope=False)),
                  get_model=lambda: SimpleNamespace(shared_experts=shared),
                  resolve_routing_inputs=lambda layer_id=None, is_draft=None,
                  num_token_non_padded=None, expert_location_dispatch_info=None: (
                      num_token_non_padded, expert_location_dispatch_info),
                  has_per_rank_fused_shared_slots=lambda n: False,
                  logger=__import__("logging").getLogger(name))
        src = self.src.source(name) or ""
        names = [n for n in ("_RENORMALIZE_SUM_EPSILON", "HashTopK") if _defines(src, n)]
        self._exec(name, extract(src, names), ns)

    def _indexer(self) -> None:
        name = "sglang.srt.layers.attention.dsv4.indexer"
        code = extract(self.src.source(name) or "", ["fp8_paged_mqa_logits_torch_sm120"])
        self._exec(name, code, {"FP8_DTYPE": torch.float8_e4m3fn})

    def _deepseek_v4(self, guard: str) -> None:
        from dsv4bisect.sglang_hooks.targets import hc_pre_target

        name = "sglang.srt.models.deepseek_v4"
        src = self.src.source(name) or ""
        owner = hc_pre_target(self.layout).split(".")[-2]
        hc_pre = extract(src, ["hc_pre"], within=owner)
        code = f"\n\nclass {owner}(nn.Module):\n" + "\n".join(
            "    " + line for line in hc_pre.splitlines()) + "\n"
        if owner != "DeepseekV4DecoderLayer":  # 0.5.23: the name is an alias of a subclass
            code += ("\n\nclass DeepseekV4CudaDecoderLayer(DeepseekV4DecoderLayerBase):\n"
                     "    pass\n\nDeepseekV4DecoderLayer = DeepseekV4CudaDecoderLayer\n")
        guard_module, guard_name = guard.rsplit(".", 1)
        ops = SimpleNamespace(hc_split_sinkhorn=sinkhorn_torch)
        ns = dict(envs=Envs(), _is_hip=False, _is_npu=False, _is_xpu=False, npu_hc_pre=None,
                  ForwardBatch=object, compile_in_capture_mode=lambda f: f,
                  _MHC_POST_MULT_VALUE=2.0, MHC_POST_MULT_VALUE=2.0,
                  get_mhc_ops=lambda: ops, _get_mhc_ops=lambda: ops,
                  use_symmetric_memory=lambda *a, **k: contextlib.nullcontext(),
                  get_tp_group=lambda: None, get_parallel=lambda: SimpleNamespace(tp_group=None),
                  is_allocation_symmetric=lambda: False, is_sm120_supported=lambda: False,
                  get_platform=lambda: SimpleNamespace(is_sm120=False),
                  _is_gfx1250_supported=False, get_bool_env_var=lambda *a: False,
                  is_gfx95_supported=lambda: False)
        if guard_module == name:
            code = extract(src, [guard_name]) + code
        else:  # 0.5.19+: the guard and what it calls live in their own module
            gsrc = self.src.source(guard_module) or ""
            names = [n for n in ("_is_fused_mhc_post_pre_enabled", "_is_aiter_gfx95_mhc_available",
                                 "_is_production_mhc_enabled", guard_name) if _defines(gsrc, n)]
            self._exec(guard_module, extract(gsrc, list(dict.fromkeys(names))), dict(ns))
        self._exec(name, code, ns)


def _defines(source: str, name: str) -> bool:
    return any(getattr(n, "name", None) == name or any(getattr(t, "id", None) == name
                                                       for t in getattr(n, "targets", []))
               for n in ast.parse(source).body)


def mhc_combine_torch(x_flat: torch.Tensor, pre: torch.Tensor, hc: int,
                      out_dtype: torch.dtype) -> torch.Tensor:
    """torch transcription of SGLang's Triton `mhc_combine` (0.5.23):
    y[m, h] = sum_k pre[m, k] · x_flat[m, k·H + h], fp32, cast to `out_dtype`."""
    m = x_flat.shape[0]
    return (pre.unsqueeze(-1) * x_flat.float().view(m, hc, -1)).sum(dim=1).to(out_dtype)


def make_hash_topk(cls: type, **kw: Any) -> Any:
    """Construct a HashTopK with the arguments its release takes (0.5.23 dropped
    num_fused_shared_experts and made the rest keyword-only)."""
    import inspect

    params = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in kw.items() if k in params})


def decoder_layer(cls: type, hc_mult: int = 4, eps: float = 1e-6, iters: int = 20) -> Any:
    """An instance of the synthetic DeepseekV4DecoderLayer with the attributes hc_pre reads."""
    layer = cls.__new__(cls)
    nn.Module.__init__(layer)
    layer.hc_mult, layer.rms_norm_eps, layer.hc_eps, layer.hc_sinkhorn_iters = (
        hc_mult, eps, eps, iters)
    return layer


def make_deepseek_v2_moe() -> type:
    """A fresh stand-in class per tree (hooks are applied to the class object)."""

    class ModelOptNvFp4FusedMoEMethod:
        """Stand-in named like SGLang's NVFP4 MoE method (the contract keys on the class name)."""

        _moe_runner_backend = "triton"


    class Fp8MoEMethod:
        _moe_runner_backend = "triton"


    class DeepseekV2MoE(nn.Module):
        """Stand-in for SGLang's DeepseekV2MoE (whose construction needs a GPU and a distributed
        setup): same signature, and the attributes the routed-scaling contract reads, with the
        real extracted HashTopK on hash layers. `config.nvfp4` picks the experts' method."""

        def __init__(self, config: Any, layer_id: int, quant_config: Any = None, prefix: str = "",
                     alt_stream: Any = None, is_nextn: bool = False, is_deepseek_v4: bool = False,
                     dsa_enable_prefill_cp: bool = False, mla_enable_prefill_cp: bool = False):
            super().__init__()
            self.layer_id = layer_id
            self.is_hash = layer_id < config.num_hash_layers
            method = ModelOptNvFp4FusedMoEMethod() if config.nvfp4 else Fp8MoEMethod()
            self.experts = SimpleNamespace(
                quant_method=method, should_fuse_routed_scaling_factor_in_topk=config.nvfp4,
                moe_runner_config=SimpleNamespace(routed_scaling_factor=1.5, swiglu_limit=10.0))
            if self.is_hash:
                from sglang.srt.layers.moe.hash_topk import HashTopK

                self.topk = make_hash_topk(
                    HashTopK, topk=6, num_experts=16, num_fused_shared_experts=0, vocab_size=64,
                    routed_scaling_factor=1.5, apply_routed_scaling_factor_on_output=config.nvfp4)
            else:
                self.topk = SimpleNamespace(topk_config=SimpleNamespace(
                    apply_routed_scaling_factor_on_output=config.nvfp4))

    return DeepseekV2MoE


# ------------------------------------------------------------ SM120 sparse decode (mma-decode)
def paged_decode_case(B: int, H: int, n_swa: int, n_extra: int, seed: int = 0):
    """Synthetic FP8 MODEL1 pages in SGLang's layout (SWA page 256, C4 page 64) and
    SGLang-style decode arguments."""
    from dsv4bisect.kernels.sparse_attention import model1_pack

    g = torch.Generator().manual_seed(seed)
    swa_rows, extra_rows = 600, 300
    swa = model1_pack(torch.randn(swa_rows, 512, generator=g), 256)  # [pages, page_bytes]
    ext = model1_pack(torch.randn(extra_rows, 512, generator=g), 64)

    def view(raw, P):  # SGLang passes a [pages, P, 1, bytes/token] fp8 view with page stride
        return raw.view(torch.float8_e4m3fn).as_strided((raw.shape[0], P, 1, 584),
                                                        (raw.shape[1], 584, 584, 1))

    idx = torch.randint(0, swa_rows, (B, 1, n_swa), generator=g, dtype=torch.int32)
    idx[0, 0, -3:] = -1
    eidx = torch.randint(0, extra_rows, (B, 1, n_extra), generator=g, dtype=torch.int32)
    kw = dict(q=(torch.randn(B, 1, H, 512, generator=g) * 0.3).to(torch.bfloat16),
              k_cache=view(swa, 256), head_dim_v=512, softmax_scale=512 ** -0.5,
              indices=idx, topk_length=torch.randint(n_swa // 2, n_swa + 1, (B,), generator=g,
                                                     dtype=torch.int32),
              attn_sink=torch.randn(H, generator=g), extra_k_cache=view(ext, 64),
              extra_indices_in_kvcache=eidx, extra_topk_length=torch.full((B,), n_extra,
                                                                          dtype=torch.int32))
    return kw


# ---------------------------------------------------------------- hot switching (test_hot_*)
class Recorded:
    """A pool or manager whose clearing methods count their calls (what flush_cache clears)."""

    def __init__(self, **attrs: Any) -> None:
        self.calls: dict[str, int] = {}
        self.__dict__.update(attrs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> None:
            self.calls[name] = self.calls.get(name, 0) + 1

        return call


class _Batch:
    def __init__(self) -> None:
        self.reqs: list[Any] = []

    def is_empty(self) -> bool:
        return not self.reqs


def add_scheduler(tree: SglangTree) -> None:
    """The wheel's own `Scheduler.flush_cache`, `is_fully_idle` and `_pp_microbatches_drained`
    (extracted by AST into a class of their own) and a `ModelRunner` stand-in that has the
    release's decode-graph re-capture entry (`dsv4bisect.plugin.graphs.RECAPTURE`, checked
    against every wheel by test_hot_static.py): capturing needs a GPU and a built model."""
    import enum

    from dsv4bisect.plugin.graphs import recapture_entry

    name = "sglang.srt.managers.scheduler"
    body = extract(tree.src.source(name) or "",
                   ["flush_cache", "is_fully_idle", "_pp_microbatches_drained"],
                   within="Scheduler")
    code = "class Scheduler:\n" + "\n".join("    " + line for line in body.splitlines()) + "\n"

    class DisaggregationMode(enum.Enum):
        NULL, PREFILL, DECODE = "null", "prefill", "decode"

    tree._exec(name, code, dict(
        current_platform=SimpleNamespace(empty_cache=lambda: None), DisaggregationMode=
        DisaggregationMode, logger=__import__("logging").getLogger(name),
        get_parallel=lambda: SimpleNamespace(pp_size=1), get_memory=lambda: None))
    entry = recapture_entry(tree.version)
    assert entry is not None
    method, attr = entry

    def recapture(self: Any) -> None:
        self.captures += 1
        setattr(self, attr, object())  # a new decode graph runner

    runner_cls = type("ModelRunner", (), {method: recapture, "captures": 0})
    tree._add("sglang.srt.model_executor.model_runner", _module(
        "sglang.srt.model_executor.model_runner", ModelRunner=runner_cls))


def make_scheduler(tree: SglangTree, graphs: bool = True) -> Any:
    """An idle Scheduler of the extracted class with the attributes its flush_cache and
    is_fully_idle read (pools recorded), and a ModelRunner holding a decode graph."""
    import importlib

    from dsv4bisect.plugin.graphs import recapture_entry

    sched_mod = importlib.import_module("sglang.srt.managers.scheduler")
    runner_mod = importlib.import_module("sglang.srt.model_executor.model_runner")
    runner = runner_mod.ModelRunner()
    _, attr = recapture_entry(tree.version) or ("", "")
    runner.eager_runner = object()
    setattr(runner, attr, object() if graphs else runner.eager_runner)
    s = sched_mod.Scheduler.__new__(sched_mod.Scheduler)
    s.__dict__.update(
        running_batch=_Batch(), chunked_req=None, cur_batch=None, cur_batch_for_debug=None,
        last_batch=None, enable_overlap=False, result_queue=[], waiting_queue=[],
        dllm_manager=SimpleNamespace(any_staging_reqs=lambda: False),
        ps=SimpleNamespace(pp_size=1), grammar_manager=Recorded(grammar_queue=[]),
        disaggregation_mode=sched_mod.DisaggregationMode.NULL, enable_hisparse=False,
        enable_hierarchical_cache=False, enable_lmcache=False, tree_cache=Recorded(),
        req_to_token_pool=Recorded(), token_to_kv_pool_allocator=Recorded(),
        metrics_reporter=Recorded(is_stats_logging_rank=False), draft_worker=None,
        _engine_paused=False, tp_worker=SimpleNamespace(model_runner=runner))
    return s


def real_environ(src: SourceTree) -> types.ModuleType:
    """The wheel's own `sglang/srt/environ.py` (stdlib only), as a module outside sys.modules.
    Its last import (the CUDA core-dump helper, unconditional in 0.5.13 – 0.5.17) finds empty
    modules, put into sys.modules for the import and removed again."""
    names = ("sglang", "sglang.srt", "sglang.srt.debug_utils",
             "sglang.srt.debug_utils.cuda_coredump")
    added = [n for n in names if n not in sys.modules]
    for n in added:
        sys.modules[n] = _module(n, __path__=[])
    try:
        mod = types.ModuleType("sglang.srt.environ")
        code = src.source("sglang.srt.environ") or ""
        exec(compile(code, f"/{src.root.name}/sglang/srt/environ.py", "exec"), mod.__dict__)
    finally:
        for n in added:
            sys.modules.pop(n, None)
    return mod


def import_with_environ(tree: SglangTree, module: str, environ: types.ModuleType) -> types.ModuleType:
    """Import the wheel's `module` again, its `from sglang.srt.environ import envs` finding the
    wheel's own environ.py (`real_environ`): module-level `X = envs.VAR.get()` then reads
    os.environ as at a real import. The stand-in environ is put back afterwards."""
    stand_in = sys.modules["sglang.srt.environ"]
    sys.modules["sglang.srt.environ"] = environ
    try:
        return tree.whole(module)
    finally:
        sys.modules["sglang.srt.environ"] = stand_in
