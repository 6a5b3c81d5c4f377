"""mhc-bf16 on vLLM: the mHC pre block with its mixing GEMM on bf16 operands, at each layout's
own site (`targets.mhc_sites`).

vLLM's mHC pre (`kernels/mhc/torch.py` `mhc_pre_torch` is its reference, the TileLang kernels
its speed path) computes `mixes = (x·fnᵀ)·rsqrt(mean(x²)+eps)` from the flattened residual
streams x [T, n·D] bf16 and fn [(2+n)·n, n·D] fp32, then pre = σ(·)+eps, post = σ(·)·mult and
comb = Sinkhorn(softmax(·)), and collapses the streams with pre in fp32. The hook computes the
same, with the mixes from `dsv4bisect.kernels.mhc_mixes`' PyTorch reference in `bf16` mode
(operands rounded to bf16, fp32 accumulation, bf16 product, fp32 norm factor): pure torch ops,
so vLLM's `torch.compile(fullgraph=True)` traces it and its CUDA graphs capture it (the Triton
kernel would break the graph). Where the caller hands it a norm (`norm_weight`, the RMSNorm
vLLM fuses into the pre kernel from 0.22.0), the collapsed stream is RMS-normalised in fp32
and scaled by the weight before its one rounding to bf16. The post half of a fused post+pre is
vLLM's own `mhc_post_tilelang`. Shapes follow `mhc_pre_torch`: post [.., n, 1], comb [.., n, n],
layer input [.., D]. Torch is imported inside the functions (the patch's declaration imports
this module without it).
"""

from __future__ import annotations

from typing import Any

from dsv4bisect.patchspec.plan import HookSpec, Plan, Recorder
from dsv4bisect.patchspec.spec import VllmSite
from dsv4bisect.vllm_hooks import targets as tg

MODES = {"bf16": "bf16"}  # variant -> mixes mode (`fp32` is the GPU check's exact arm)


def mhc_pre(residual: Any, fn: Any, hc_scale: Any, hc_base: Any, rms_eps: float,
            hc_pre_eps: float, hc_sinkhorn_eps: float, hc_post_mult_value: float,
            sinkhorn_repeat: int, n_splits: int = 1, norm_weight: Any = None,
            norm_eps: float = 1e-6, *, mode: str = "bf16") -> tuple[Any, Any, Any]:
    """`mhc_pre_tilelang`'s contract: residual [.., n, D] bf16 -> (post [.., n, 1] fp32, comb
    [.., n, n] fp32, layer input [.., D] bf16), as `mhc_pre_torch` with `mode` mixes (and the
    fused RMSNorm when given). `n_splits` is the kernels' split choice: the hook has none."""
    import torch

    del n_splits

    from dsv4bisect.kernels.mhc_mixes import mhc_mixes_ref

    n, d = residual.shape[-2], residual.shape[-1]
    outer = residual.shape[:-2]
    flat = residual.reshape(-1, n * d)
    t = flat.shape[0]
    mixes = mhc_mixes_ref(flat, fn, rms_eps, mode=mode)  # [T, (2+n)·n] fp32
    pre = torch.sigmoid(mixes[:, :n] * hc_scale[0] + hc_base[:n]) + hc_pre_eps
    post = torch.sigmoid(mixes[:, n:2 * n] * hc_scale[1] + hc_base[n:2 * n]) \
        * hc_post_mult_value
    comb = mixes[:, 2 * n:].view(t, n, n) * hc_scale[2] + hc_base[2 * n:].view(1, n, n)
    comb = torch.softmax(comb, dim=-1) + hc_sinkhorn_eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_sinkhorn_eps)
    for _ in range(sinkhorn_repeat - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + hc_sinkhorn_eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_sinkhorn_eps)
    y = (pre.unsqueeze(-1) * flat.view(t, n, d).float()).sum(dim=1)  # [T, D] fp32
    if norm_weight is not None:
        y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + norm_eps) * norm_weight.float()
    return (post.view(*outer, n, 1), comb.view(*outer, n, n),
            y.to(torch.bfloat16).view(*outer, d))


def fused_post_pre(post_fn: Any, x: Any, residual: Any, post_layer_mix: Any,
                   comb_res_mix: Any, fn: Any, hc_scale: Any, hc_base: Any, rms_eps: float,
                   hc_pre_eps: float, hc_sinkhorn_eps: float, hc_post_mult_value: float,
                   sinkhorn_repeat: int, n_splits: int = 1, tile_n: int = 1,
                   norm_weight: Any = None, norm_eps: float = 1e-6, *, mode: str = "bf16"
                   ) -> tuple[Any, Any, Any, Any]:
    """vLLM's post (`post_fn`), then the hook's pre on the new residual streams:
    (residual_cur, post, comb, layer input), the fused op's contract."""
    del n_splits, tile_n  # the kernels' split choices: the hook's GEMM has none
    cur = post_fn(x, residual, post_layer_mix, comb_res_mix)
    post, comb, y = mhc_pre(cur, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                            hc_post_mult_value, sinkhorn_repeat, norm_weight=norm_weight,
                            norm_eps=norm_eps, mode=mode)
    return cur, post, comb, y


def pre_broadcast(residual: Any, fn: Any, hc_scale: Any, hc_base: Any, rms_eps: float,
                  hc_pre_eps: float, hc_sinkhorn_eps: float, hc_post_mult_value: float,
                  sinkhorn_repeat: int, n_splits: int = 1, norm_weight: Any = None,
                  norm_eps: float = 1e-6, fn_broadcast: Any = None, *, mode: str = "bf16"
                  ) -> tuple[Any, Any, Any, Any]:
    """The first layer: residual [T, D] broadcast to n equal streams, then the pre. Returns
    (streams [T, n, D], post, comb, layer input) as `mhc_pre_broadcast_tilelang`."""
    del n_splits, fn_broadcast  # fn summed over the streams: the hook uses fn on the copies
    n = fn.shape[1] // residual.shape[-1]
    streams = residual.unsqueeze(-2).expand(residual.shape[0], n, residual.shape[-1])
    streams = streams.contiguous()
    post, comb, y = mhc_pre(streams, fn, hc_scale, hc_base, rms_eps, hc_pre_eps,
                            hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat,
                            norm_weight=norm_weight, norm_eps=norm_eps, mode=mode)
    return streams, post, comb, y


def _layer_pre(layer: Any, x: Any, hc_fn: Any, hc_scale: Any, hc_base: Any,
               norm_weight: Any, norm_eps: float, mode: str) -> tuple[Any, Any, Any]:
    """`DeepseekV4DecoderLayer.hc_pre` (0.20.0 / 0.22.0): (layer input, post, comb)."""
    post, comb, y = mhc_pre(x, hc_fn, hc_scale, hc_base, layer.rms_norm_eps, layer.hc_eps,
                            layer.hc_eps, layer.hc_post_alpha, layer.hc_sinkhorn_iters,
                            norm_weight=norm_weight, norm_eps=norm_eps, mode=mode)
    return y, post, comb


def plan(variant: str, layout: str, rec: Recorder) -> Plan:
    mode = MODES.get(variant)
    if mode is None:
        return Plan("refuse", reason=f"mhc-bf16 has no vLLM hook for variant {variant!r}")
    hooks: list[HookSpec] = []
    for site in tg.mhc_sites(layout):
        hooks.append(HookSpec(site.target, "replace", _hook(site, layout, mode, rec), True))
    return Plan("install", tuple(hooks), notes=(
        "mixes on bf16 operands (PyTorch, traced by vLLM's torch.compile); the post half of "
        "a fused post+pre stays vLLM's own",))


def _hook(site: VllmSite, layout: str, mode: str, rec: Recorder) -> Any:
    target = site.target
    if site.name == "hc_pre":
        def hc_pre(self: Any, x: Any, hc_fn: Any, hc_scale: Any, hc_base: Any,
                   norm_weight: Any = None, norm_eps: float = 1e-6) -> Any:
            rec.called(target)
            return _layer_pre(self, x, hc_fn, hc_scale, hc_base, norm_weight, norm_eps, mode)
        return hc_pre
    if site.name in ("mhc_pre_tilelang",):
        def pre(*args: Any, **kwargs: Any) -> Any:
            rec.called(target)
            return mhc_pre(*args, mode=mode, **kwargs)
        return pre
    if site.name == "mhc_pre_broadcast_tilelang":
        def broadcast(*args: Any, **kwargs: Any) -> Any:
            rec.called(target)
            return pre_broadcast(*args, mode=mode, **kwargs)
        return broadcast
    post_fn = _post_fn()
    if site.name == "forward_cuda":  # 0.22.0: MHCFusedPostPreOp.forward_cuda(self, ...)
        def op_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
            rec.called(target)
            return fused_post_pre(post_fn, *args, mode=mode, **kwargs)
        return op_forward

    def fused(*args: Any, **kwargs: Any) -> Any:
        rec.called(target)
        return fused_post_pre(post_fn, *args, mode=mode, **kwargs)
    return fused


def _post_fn() -> Any:
    """vLLM's own post kernel (its original, before any dsv4bisect hook)."""
    import pkgutil

    from dsv4bisect.vllm_hooks import ORIGINALS

    target = f"{tg.MHC}.mhc_post_tilelang"
    return ORIGINALS.get(target) or pkgutil.resolve_name(target)
