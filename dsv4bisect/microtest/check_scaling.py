"""hash-topk-scaling: where `routed_scaling_factor` is applied, and how often, per MoE layer and
MoE runner choice — the scaling contract, with the real gate, `tid2eid` and quantisation map.

Per layer: the routed experts' method comes from their stored format (`nvfp4-dispatch` on a
checkpoint whose experts are held in a higher precision makes them NVFP4, as in the embedded
engine); `runners.scaling_plan` says whether TopK/HashTopK and the runner multiply. The factor is
then measured: top-k weights of `tokens` inputs from the real gate (`sqrtsoftplus`, normalised;
hash layers select `tid2eid[token]`, score layers top-k of score + bias), times rsf where top-k
scales, times rsf where the runner scales. The routed output is linear in those weights, so this
is the factor the routed output gets. Correct: exactly rsf. A double application fails with the
factor it causes (rsf², ×2.25 on Flash); a layer stock SGLang cannot build is noted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4bisect.microtest.context import Context
from dsv4bisect.microtest.results import Row
from dsv4bisect.microtest.runners import (
    MOE_METHODS,
    RUNNER_LABELS,
    expert_method,
    scaling_plan,
)
from dsv4bisect.microtest.tolerances import SCALING_REL

PATCH = "hash-topk-scaling"


def applies(ctx: Context, layer: int) -> bool:
    return True


def needs(ctx: Context, layer: int) -> list[str]:
    gate = f"layers.{layer}.ffn.gate."
    route = gate + ("tid2eid" if ctx.args.is_hash_layer(layer) else "bias")
    return [f"layers.{layer}.ffn_norm.weight", gate + "weight", route]


def layer_method(ctx: Context, layer: int) -> tuple[str, str]:
    """(method, stored format) of the layer's routed experts, as deployed with the patch set."""
    ids = ctx.weights.expert_ids(layer)
    if not ids:
        return "dense", "absent"
    stored = ctx.weights.stored_format(f"layers.{layer}.ffn.experts.{ids[0]}.w1.weight")
    method = expert_method(stored)
    if "nvfp4-dispatch" in ctx.spec.patches and method in ("dense", "fp8"):
        method = "nvfp4"  # the patch quantises higher-precision experts to NVFP4
    return method, stored


def topk_weights(ctx: Context, layer: int) -> tuple[torch.Tensor, str]:
    """Normalised top-k weights [T, k] of the real router (no rsf) and the input source."""
    a, w = ctx.args, ctx.weights
    gate = f"layers.{layer}.ffn.gate."
    x, source = ctx.acts.sublayer_input(layer, "ffn", w.get(f"layers.{layer}.ffn_norm.weight"),
                                        ctx.spec.tokens)
    scores = F.softplus(x @ w.get(gate + "weight").T).sqrt()  # [T, E]
    if a.is_hash_layer(layer):
        tokens, source_t = ctx.acts.tokens(ctx.spec.tokens)
        ids = w.get(gate + "tid2eid")[tokens]
        _check_tid2eid(ids, a.n_routed_experts, layer)
        source = f"{source}; tokens {source_t}"
    else:
        ids = torch.topk(scores + w.get(gate + "bias"), a.num_experts_per_tok, dim=-1).indices
    picked = scores.gather(1, ids.long())
    return picked / picked.sum(-1, keepdim=True), source


def _check_tid2eid(ids: torch.Tensor, n_experts: int, layer: int) -> None:
    from dsv4bisect.errors import ConfigError

    if int(ids.min()) < 0 or int(ids.max()) >= n_experts:
        raise ConfigError(f"layers.{layer}.ffn.gate.tid2eid holds expert ids outside "
                          f"0..{n_experts - 1}", "the checkpoint's hash table is corrupt")


def run(ctx: Context, layer: int) -> list[Row]:
    a = ctx.args
    rsf, is_hash = a.routed_scaling_factor, a.is_hash_layer(layer)
    variant = ctx.variant(PATCH)
    method, stored = layer_method(ctx, layer)
    weights, source = topk_weights(ctx, layer)
    kind = "hash" if is_hash else "score"
    rows = []
    for backend in ctx.spec.runners:
        plan = scaling_plan(method, backend, is_hash=is_hash, variant=variant)
        stock = scaling_plan(method, backend, is_hash=is_hash, variant=None)
        summed = weights.sum(-1) * (rsf if plan.topk else 1.0)  # [T]
        # rounded to 1e-6: rows of layers with the same outcome merge into one table row
        factor = round(float(summed.mean()) * (rsf if plan.runner else 1.0), 6)
        dev = round(abs(factor / rsf - 1.0), 6)
        note = f"{plan.where}: x{factor:.4g} (want x{rsf:g})"
        if stock.where != plan.where:
            note += f"; stock: {stock.where}"
        rows.append(Row(PATCH, (layer,), f"{RUNNER_LABELS[backend]}, {kind} layer, {method}",
                        "factor_dev", dev, SCALING_REL,
                        counted=ctx.counted(PATCH, variant or "topk"), note=note,
                        detail={"backend": backend, "method": MOE_METHODS[method],
                                "stored": stored, "applied": plan.count, "where": plan.where,
                                "kernel": plan.kernel, "factor": factor, "rsf": rsf,
                                "topk_sum_spread": round(float(summed.max() - summed.min()), 6),
                                "stock": stock.where, "activations": source}))
    return rows
