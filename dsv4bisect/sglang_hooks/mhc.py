"""mhc-bf16: `DeepseekV4DecoderLayer.hc_pre` with the mixing GEMM on bf16 operands.

Replaces the method (the inner `hc_pre_torch_impl` closure is not addressable) and keeps its
contract: `(y [T, D] in x.dtype, post [T, n] fp32, comb [T, n, n] fp32, norm_fused=False)`,
`T == 0` handled, no host sync (CUDA-graph capturable). The mixes come from
`dsv4bisect.kernels.mhc_mixes` (Triton on CUDA, its PyTorch reference elsewhere); then, as in
SGLang's torch path, SGLang's own `hc_split_sinkhorn` (where the layout keeps it:
`targets.sinkhorn_target`, resolved at install so a moved one is refused, not a crash at the
first forward) and the fp32 stream collapse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dsv4bisect.patchspec.plan import HookSpec, Plan, Recorder, first_call
from dsv4bisect.sglang_hooks.targets import fused_guard_target, hc_pre_target, sinkhorn_target

if TYPE_CHECKING:
    import torch


def mixes(x_flat: torch.Tensor, hc_fn: torch.Tensor, eps: float, mode: str) -> torch.Tensor:
    """m = (x·fnᵀ)·rsqrt(mean(x²)+eps): x_flat [T, n·D] -> [T, M] fp32 (kernel on CUDA)."""
    from dsv4bisect.kernels import mhc_mixes as k
    from dsv4bisect.sglang_hooks.attention import _use_triton

    if _use_triton(x_flat):
        return k.mhc_mixes(x_flat, hc_fn, eps, mode=mode)
    return k.mhc_mixes_ref(x_flat, hc_fn, eps, mode=mode)


def hc_pre(layer: Any, x: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor,
           hc_base: torch.Tensor, norm: Any = None, forward_batch: Any = None, *,
           mode: str = "bf16", sinkhorn: Callable[..., Any]
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """x: [T, n, D] residual streams; `sinkhorn` is SGLang's own `hc_split_sinkhorn`.
    Returns (y [T, D], post [T, n], comb [T, n, n], False)."""
    import torch

    del norm, forward_batch  # the norm is applied by the caller (norm_fused=False)
    shape, dtype, n = x.size(), x.dtype, layer.hc_mult
    if x.shape[0] == 0:
        return (x.new_empty((0, shape[-1])),
                torch.empty((0, n), dtype=torch.float32, device=x.device),
                torch.empty((0, n, n), dtype=torch.float32, device=x.device), False)
    flat = x.flatten(1)  # [T, n·D]
    m = mixes(flat, hc_fn, layer.rms_norm_eps, mode).unsqueeze(1)  # [T, 1, (2+n)·n]
    pre, post, comb = sinkhorn(m, hc_scale, hc_base, n, layer.hc_sinkhorn_iters, layer.hc_eps)
    y = (pre.squeeze(1).unsqueeze(-1) * flat.float().view(shape)).sum(dim=1)  # fp32 collapse
    return y.to(dtype), post.squeeze(1), comb.squeeze(1), False


def fused_path_check(layout: str) -> Callable[[], str | None]:
    """SGLang's fused post+pre path bypasses hc_pre at most sites: refuse rather than pass.
    The guard is the layout's own function (it moved in 0.5.19); the installer has already
    checked that it exists, so this never passes blind."""

    def check() -> str | None:
        import pkgutil

        if pkgutil.resolve_name(fused_guard_target(layout))():
            return ("SGLANG_OPT_FUSE_MHC_POST_PRE is on: the fused mHC post+pre kernel bypasses "
                    "hc_pre; turn the fused-mhc-post-pre patch off (it sets the switch to 0)")
        return None

    return check


def plan(variant: str, layout: str, rec: Recorder) -> Plan:
    import pkgutil

    mode = {"bf16": "bf16"}.get(variant)
    if mode is None:
        return Plan("refuse", reason=f"mhc-bf16 has no SGLang hook for variant {variant!r}")
    target = hc_pre_target(layout)
    mark = first_call(rec, target)
    try:
        sinkhorn = pkgutil.resolve_name(sinkhorn_target(layout))
    except (ImportError, AttributeError, ValueError) as exc:
        return Plan("refuse", reason=f"cannot resolve {sinkhorn_target(layout)}: {exc}")

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        mark()
        return hc_pre(self, *args, mode=mode, sinkhorn=sinkhorn, **kwargs)

    return Plan("install", (HookSpec(target, "replace", hook, on_path=True),),
                check=fused_path_check(layout))
