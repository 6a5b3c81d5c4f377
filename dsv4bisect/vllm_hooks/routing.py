"""hash-topk-scaling on vLLM: where `routed_scaling_factor` is applied on hash-routed layers.

vLLM routes DeepSeek-V4's hash layers (layers < num_hash_layers, `gate.tid2eid`) in
`fused_topk_bias(..., hash_indices_table=..., routed_scaling_factor=...)`
(`fused_moe/router/fused_topk_bias_router.py`): the CUDA op `topk_hash_softplus_sqrt` takes rsf
inside, the torch tail multiplies it at the end. So the patch's default variant is upstream
behaviour on every verified release (inert). `double-scale` (fault) models the stock SGLang
NVFP4 + Marlin bug on vLLM's site: AROUND `fused_topk_bias`, the hash layers' weights are
multiplied by the model's rsf once more (recorded AFTER `DeepseekV4MoE.__init__`, because with
`apply_routed_scale_to_output` vLLM hands the router rsf = 1 and scales the MoE output instead:
the fault is "routed output × rsf too large" either way). The model module's by-value copy of
`fused_topk_bias` is rebound; the router's own module calls it by its global name.
"""

from __future__ import annotations

from typing import Any

from dsv4bisect.patchspec.plan import HookSpec, Plan, Recorder
from dsv4bisect.patchspec.spec import EngineContext
from dsv4bisect.vllm_hooks import targets as tg

RSF: dict[str, float] = {}  # "model": the routed_scaling_factor the MoE blocks were built with
HASH_INDEX = 8  # position of `hash_indices_table` in fused_topk_bias (every verified release)


def extra_factor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    """The fault's extra factor for this call: the model's rsf on a hash layer, else 1."""
    table = kwargs.get("hash_indices_table", args[HASH_INDEX] if len(args) > HASH_INDEX
                       else None)
    if table is None:
        return 1.0
    if "model" in RSF:
        return RSF["model"]
    passed = kwargs.get("routed_scaling_factor", args[9] if len(args) > 9 else 1.0)
    return float(passed)


UPSTREAM = ("vLLM applies routed_scaling_factor on hash-routed layers itself "
            "(fused_topk_bias with hash_indices_table, every verified release)")


def inert(variant: str, ctx: EngineContext) -> str | None:
    """The default variant is what vLLM does itself (the resolver does not send it)."""
    return UPSTREAM if variant == "topk" else None


def plan(variant: str, layout: str, rec: Recorder) -> Plan:
    if variant == "topk":
        return Plan("inert", reason=UPSTREAM)
    if variant != "double-scale":
        return Plan("refuse", reason=f"hash-topk-scaling has no vLLM hook for {variant!r}")
    route, moe = tg.routing_sites(layout)

    def around(original: Any, *args: Any, **kwargs: Any) -> Any:
        rec.called(route.target)
        weights, ids = original(*args, **kwargs)
        factor = extra_factor(args, kwargs)
        return (weights * factor if factor != 1.0 else weights), ids

    def after_init(result: Any, self: Any, *args: Any, **kwargs: Any) -> None:
        rec.called(moe.target)
        RSF["model"] = float(getattr(self, "routed_scaling_factor", 1.0))

    return Plan("install", (HookSpec(moe.target, "after", after_init, True),
                            HookSpec(route.target, "around", around, True)),
                notes=("fault: hash layers' routed weights x rsf once more",))
