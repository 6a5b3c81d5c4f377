"""Run the micro-tests of a `MicrotestSpec` and write `microtest.md` + `microtest.json`.

Order: open the checkpoint (headers only), resolve the layers, ask every selected check which
tensors it reads for each chosen layer and fail at once (ConfigError, exit 5) naming every
missing one; then layer by layer run the checks that apply and drop the layer's tensors.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dsv4bisect.errors import ConfigError
from dsv4bisect.microtest import (
    check_attention,
    check_clamp,
    check_indexer,
    check_mhc,
    check_nvfp4,
    check_scaling,
)
from dsv4bisect.microtest.activations import Activations
from dsv4bisect.microtest.context import Context
from dsv4bisect.microtest.contrast import mark_contrast
from dsv4bisect.microtest.markdown import render_markdown
from dsv4bisect.microtest.results import MicrotestReport, Row, merge_rows
from dsv4bisect.microtest.spec import MICROTESTED, MicrotestSpec, resolve_layers
from dsv4bisect.microtest.weights import WeightSource

CHECKS = {m.PATCH: m for m in (check_mhc, check_scaling, check_attention, check_indexer,
                               check_nvfp4, check_clamp)}
assert tuple(CHECKS) == MICROTESTED, "every microtested patch has exactly one check module"
_NONE_APPLY = {"triton-indexer": "no CSA (ratio-4) layer among the chosen layers"}


def resolve_device(name: str) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda but CUDA is not available", "use --device cpu")
        return torch.device("cuda")
    raise ConfigError(f"unknown device `{name}`", "use cpu or cuda")


def run_microtest(
    spec: MicrotestSpec, on_row: Callable[[Row], None] | None = None
) -> MicrotestReport:
    """Measure every selected patch on the chosen layers; `on_row` sees each row as it is made."""
    start = time.monotonic()
    device = resolve_device(spec.device)
    weights = WeightSource.open(spec.checkpoint, device)
    try:
        layers = resolve_layers(spec.layers, weights.args)
        acts = Activations.open(spec.activations, weights.args, device, spec.seed)
        ctx = Context(spec, weights, acts, device)
        plan = {p: [n for n in layers if CHECKS[p].applies(ctx, n)] for p in spec.patches}
        weights.require([name for p, ls in plan.items() for n in ls
                         for name in CHECKS[p].needs(ctx, n)], "the chosen checks read")
        rows = _run_layers(ctx, plan, layers, on_row or (lambda r: None))
        setup = _setup(ctx, layers)
        reads = len(set(weights.reads))
    finally:
        weights.close()
    return MicrotestReport(tuple(rows), setup, time.monotonic() - start, reads)


def _run_layers(ctx: Context, plan: dict[str, list[int]], layers: tuple[int, ...],
                on_row: Callable[[Row], None]) -> list[Row]:
    by_patch: dict[str, list[Row]] = {p: [] for p in plan}
    for patch, chosen in plan.items():
        if not chosen:
            row = Row(patch, (), "not measured", "rel_err", float("nan"),
                      note=_NONE_APPLY.get(patch, "no chosen layer applies"))
            by_patch[patch].append(row)
            on_row(row)
    with torch.no_grad():
        for layer in layers:  # layer-major: each layer's tensors are read once, then dropped
            for patch, chosen in plan.items():
                if layer in chosen:
                    for row in CHECKS[patch].run(ctx, layer):
                        row = mark_contrast(row, ctx.spec.deployed_runner,
                                            ctx.args.max_position_embeddings)
                        by_patch[patch].append(row)
                        on_row(row)
            ctx.weights.release()
    out: list[Row] = []
    for patch, rows in by_patch.items():
        out += merge_rows(rows) if patch == check_scaling.PATCH else rows
    return out


def _setup(ctx: Context, layers: tuple[int, ...]) -> dict[str, object]:
    a = ctx.args
    return {
        **ctx.spec.describe(),
        "checkpoint": ctx.weights.label,
        "model": f"{a.num_hidden_layers} layers, hidden {a.hidden_size}, "
                 f"{a.num_attention_heads} heads x {a.head_dim}, {a.n_routed_experts} experts "
                 f"top-{a.num_experts_per_tok}, rsf {a.routed_scaling_factor:g}",
        "quant": ctx.weights.quant.describe(),
        "layers": list(layers),
        "layer_kinds": {str(n): a.layer_kind(n) + (" hash" if a.is_hash_layer(n) else "")
                        for n in layers},
        "activations": ctx.acts.label,
        "device": str(ctx.device),
    }


def write_report(report: MicrotestReport, out_dir: Path) -> Path:
    """Write `microtest.md` and `microtest.json` into `out_dir`; returns the markdown path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "microtest.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    md = out_dir / "microtest.md"
    md.write_text(render_markdown(report) + "\n")
    return md
