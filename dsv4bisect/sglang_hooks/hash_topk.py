"""hash-topk-scaling: `HashTopK` applies `routed_scaling_factor` to its top-k weights.

Layout 0.5.13 (stock asserts "not implemented"): AROUND `__init__` builds the module with the
flag off (passing the assert), then stores the requested flag — as upstream 0.5.14 does,
including its refusal with fused shared experts; AROUND `forward` multiplies the weights after
the original routing. Layout 0.5.14 already does both: the default variant is inert there.

`double-scale` (fault): the routed output ends up × rsf too large on hash layers. SGLang's
design is that exactly one of top-k (`apply_routed_scaling_factor_on_output`, set from
`FusedMoE.should_fuse_routed_scaling_factor_in_topk`) or the MoE runner scales; the fault adds
one more ×rsf in HashTopK on top of whatever the layer's own top-k scaling is.
"""

from __future__ import annotations

import inspect
from typing import Any

from dsv4bisect.patchspec.plan import HookSpec, Plan, Recorder, first_call

CLASS = "sglang.srt.layers.moe.hash_topk.HashTopK"
INIT, FORWARD = f"{CLASS}.__init__", f"{CLASS}.forward"
FLAG = "apply_routed_scaling_factor_on_output"


def extra_factor(topk: Any, variant: str, layout: str) -> float:
    """What the hook multiplies HashTopK's weights by, on top of the original forward."""
    rsf = float(topk.routed_scaling_factor)
    own = rsf if getattr(topk, FLAG, False) else 1.0  # the (upstream) top-k scaling
    base = own if layout == "0.5.13" else 1.0  # 0.5.14's forward applies `own` itself
    return base * (rsf if variant == "double-scale" else 1.0)


def init_around(original: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """0.5.13: construct with the flag off, then store it (upstream 0.5.14 semantics)."""
    bound = inspect.signature(original).bind(self, *args, **kwargs)
    bound.apply_defaults()
    want = bool(bound.arguments.get(FLAG, False))
    bound.arguments[FLAG] = False
    original(*bound.args, **bound.kwargs)
    if want and getattr(self, "num_fused_shared_experts", 0) > 0:
        raise NotImplementedError(
            "HashTopK + apply_routed_scaling_factor_on_output is not supported with fused "
            "shared experts; pass --disable-shared-experts-fusion")
    setattr(self, FLAG, want)


def scale_output(out: Any, factor: float) -> Any:
    """Multiply a top-k output's weights (StandardTopKOutput is a NamedTuple)."""
    if factor == 1.0:
        return out
    return out._replace(topk_weights=out.topk_weights * factor)


def plan(variant: str, layout: str, rec: Recorder) -> Plan:
    if variant not in ("topk", "double-scale"):
        return Plan("refuse", reason=f"hash-topk-scaling has no variant {variant!r} on SGLang")
    if layout != "0.5.13" and variant == "topk":
        return Plan("inert", reason="SGLang >= 0.5.14 applies rsf in HashTopK itself")
    mark = first_call(rec, FORWARD)

    def forward_around(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        mark()
        return scale_output(original(self, *args, **kwargs), extra_factor(self, variant, layout))

    hooks = [HookSpec(FORWARD, "around", forward_around, on_path=True)]
    if layout == "0.5.13":
        init_mark = first_call(rec, INIT)

        def init_hook(original: Any, self: Any, *args: Any, **kwargs: Any) -> None:
            init_mark()
            init_around(original, self, *args, **kwargs)

        hooks.insert(0, HookSpec(INIT, "around", init_hook, on_path=True))
    return Plan("install", tuple(hooks))
