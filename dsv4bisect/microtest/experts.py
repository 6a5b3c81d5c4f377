"""Routed experts of one layer as the expert checks read them: a sample of held experts, their
stored format, dequantised weights and NVFP4 global scales."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4bisect.kernels.nvfp4 import E2M1_MAX, E4M3_MAX, default_global_scale
from dsv4bisect.microtest.context import Context

WEIGHTS = ("w1", "w2", "w3")  # gate, down, up


@dataclass(frozen=True)
class ExpertWeights:
    """One expert: fp32 weights, stored format, and the NVFP4 global scales of w1/w3 (stored
    `weight_scale_2` when NVFP4, else amax / (6·448)) and the static activation scale, if any."""

    expert: int
    w1: torch.Tensor  # [inter, hidden]
    w2: torch.Tensor  # [hidden, inter]
    w3: torch.Tensor  # [inter, hidden]
    stored: str
    g1: torch.Tensor
    g3: torch.Tensor
    input_scale: torch.Tensor | None


def expert_names(layer: int, expert: int) -> list[str]:
    return [f"layers.{layer}.ffn.experts.{expert}.{w}.weight" for w in WEIGHTS]


def sampled(ctx: Context, layer: int) -> list[int]:
    return ctx.weights.sample_experts(layer, ctx.spec.experts)


def needs(ctx: Context, layer: int) -> list[str]:
    ids = sampled(ctx, layer) or [0]  # none held: the error names expert 0
    return [f"layers.{layer}.ffn_norm.weight"] + [n for e in ids for n in expert_names(layer, e)]


def load(ctx: Context, layer: int, expert: int) -> ExpertWeights:
    w = ctx.weights
    n1, n2, n3 = expert_names(layer, expert)
    stored = w.stored_format(n1)

    def global_scale(name: str) -> torch.Tensor:
        side = name[: -len(".weight")] + ".weight_scale_2"
        if stored == "nvfp4":
            return w.get_stored(side).float().reshape(())
        return default_global_scale(w.get(name))

    side_in = n1[: -len(".weight")] + ".input_scale"
    input_scale = w.get_stored(side_in).float().reshape(()) if stored == "nvfp4" and \
        w.has(side_in) else None
    return ExpertWeights(expert, w.get(n1), w.get(n2), w.get(n3), stored, global_scale(n1),
                         global_scale(n3), input_scale)


def activation_scale(x: torch.Tensor, ex: ExpertWeights) -> torch.Tensor:
    """The activation global scale [T, 1]: the checkpoint's static `input_scale`, or dynamic
    per token amax / (6·448) as the embedded engine uses."""
    if ex.input_scale is not None:
        return ex.input_scale.expand(x.shape[0], 1)
    return x.abs().amax(-1, keepdim=True) / (E2M1_MAX * E4M3_MAX)


def moe_input(ctx: Context, layer: int) -> tuple[torch.Tensor, str]:
    norm = ctx.weights.get(f"layers.{layer}.ffn_norm.weight")
    return ctx.acts.sublayer_input(layer, "ffn", norm, ctx.spec.tokens)
