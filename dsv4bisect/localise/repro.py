"""The op-level repro: the first divergent op alone, on the good end's inputs of the forward where
it first left its envelope, under both configurations — the seeds' "micro-tests on real
tensors". One command: `python -m dsv4bisect.localise.repro REPORT_DIR/first_divergence.pt`.

`build` reads the op's inputs from a save pass (`capture.Recorder` with `keep`: the raw tensors
of the divergent layer's sites, per forward) and the settings of each configuration that the op
reads (`Numerics` views); `run_op` recomputes the op from them. Built for the ops whose code a
patch swaps in the attention and mHC: the sparse attention kernel (and, for two split-K
configurations, its parts: with one knob of the bad end's kernel set to the good end's, which
one brings its output back names `attn.sparse_attention.partials` or `.merge`), `wo_a` and the
mHC pre sites. Other ops keep their saved rows in the file and say that no recompute exists.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from dsv4bisect.localise.capture import Raw, Rows

REPRO_OPS = ("attn.sparse_attention", "attn.wo_a", "mhc.pre_attn", "mhc.pre_ffn")
PARTS_FLOOR = 0.01  # a knob "brings the output back" when 1 % or less of the divergence is left


def kernel_settings(numerics: Any) -> dict[str, Any]:
    split, partial, merge = numerics.attention
    return {"split": split, "partial": partial, "merge": merge,
            "segmented": bool(numerics.deployment and split is None)}


def op_settings(op: str, numerics: Any, model: Any, layer: int) -> dict[str, Any]:
    """What op `op` reads of a configuration (its `Numerics` view)."""
    if op == "attn.sparse_attention":
        return kernel_settings(numerics)
    if op == "attn.wo_a":
        return {"mode": numerics.wo_a_input}
    first = layer == 0 or layer >= model.a.num_hidden_layers
    return {"mode": numerics.mhc_mode,
            "dispatch_first": (first if op == "mhc.pre_attn" else False)
            if numerics.deployment else None}


def _group(raw: Raw, forward: int, seq: int) -> torch.Tensor | None:
    return next((t for f, s, t in raw.parts if f == forward and s == seq), None)


def _rows(raw: Raw, forward: int, layout: tuple[Rows, ...], seq: int) -> torch.Tensor | None:
    full = next((t for f, _, t in raw.parts if f == forward), None)
    if full is None:
        return None
    at = 0
    for r in layout:
        if r.seq == seq:
            return full[at:at + r.n]
        at += r.n
    return None


def build(op: str, module: str, raws: dict[str, Raw], layout: tuple[Rows, ...], forward: int,
          seq: int, model: Any) -> dict[str, Any] | None:
    """The op's inputs (the good end's, from its save pass) for sequence `seq` in `forward`;
    None when the save pass did not record what the op needs."""
    layer = int(module.split(".")[1])
    if op == "attn.sparse_attention":
        q = _rows(raws.get(f"{module}:attn.q:0", Raw()), forward, layout, seq)
        pool = _group(raws.get(f"{module}:attn.key_pool:0", Raw()), forward, seq)
        idx = _group(raws.get(f"{module}:attn.key_pool:1", Raw()), forward, seq)
        seg = _rows(raws.get(f"{module}:attn.flashmla_segments:0", Raw()), forward, layout, seq)
        if q is None or pool is None or idx is None:
            return None
        attn = model.layers[layer].attn
        D = pool.shape[-1]
        return {"q": q, "kv": pool.reshape(-1, D), "indices": idx.reshape(q.shape[0], -1),
                "sink": attn.attn_sink.detach().clone(), "scale": D ** -0.5,
                "segments": None if seg is None else seg[:, :idx.shape[-1]]}
    if op == "attn.wo_a":
        o = _rows(raws.get(f"{module}:attn.o:0", Raw()), forward, layout, seq)
        full = next((t for f, _, t in raws.get(f"{module}:attn.o:0", Raw()).parts
                     if f == forward), None)
        if o is None or full is None:
            return None
        attn = model.layers[layer].attn
        a = attn.a
        weight = attn.wo_a.value().detach().view(a.o_groups, a.o_lora_rank, -1).clone()
        at = sum(r.n for r in layout[:[r.seq for r in layout].index(seq)])
        # the whole forward's rows: a layout fault reads the scales of other rows
        return {"o": full, "weight": weight, "rows": (at, o.shape[0])}
    if op in ("mhc.pre_attn", "mhc.pre_ffn"):
        # its input h: the block's input (the attention site) or the attention's mHC post's
        # output (the MoE site), recorded under whichever site saw the tensor first
        sources = ([f"{module}:block:in0"] if op == "mhc.pre_attn"
                   else [f"{module}:mhc.post_attn:0"]) + [f"{module}:{op}:in0"]
        raw = next((raws[k] for k in sources if k in raws), Raw())
        h = _rows(raw, forward, layout, seq)
        full = next((t for f, _, t in raw.parts if f == forward), None)
        if h is None or full is None:
            return None
        site = "attn" if op == "mhc.pre_attn" else "ffn"
        block = model.layers[layer]
        at = sum(r.n for r in layout[:[r.seq for r in layout].index(seq)])
        return {"h": full, "rows": (at, h.shape[0]), "args": model.a.to_hf_config(),
                **{k: getattr(block, f"hc_{site}_{k}").detach().clone()
                   for k in ("fn", "scale", "base")}}
    return None


def run_op(op: str, inputs: dict[str, Any], settings: dict[str, Any]) -> torch.Tensor:
    """The op alone on `inputs` under one configuration's `settings` -> its output rows."""
    from dsv4bisect.kernels.sparse_attention import (
        sparse_attention_ref,
        sparse_attention_segmented_ref,
    )

    if op == "attn.sparse_attention":
        if settings["segmented"] and inputs["segments"] is not None:
            return sparse_attention_segmented_ref(inputs["q"], inputs["kv"], inputs["indices"],
                                                  inputs["sink"], inputs["scale"],
                                                  inputs["segments"])
        return sparse_attention_ref(inputs["q"], inputs["kv"], inputs["indices"].int(),
                                    inputs["sink"], inputs["scale"], split=settings["split"],
                                    partial_dtype=getattr(torch, settings["partial"]),
                                    merge=settings["merge"])
    if op == "attn.wo_a":
        from dsv4bisect.reference.model import wo_a_input

        o = wo_a_input(inputs["o"], settings["mode"])
        out = torch.einsum("tgd,grd->tgr", o, inputs["weight"]).reshape(o.shape[0], -1)
        a, n = inputs["rows"]
        return out[a:a + n]
    from dsv4bisect.reference.config import ModelArgs
    from dsv4bisect.reference.model import hc_pre

    args = ModelArgs.from_hf_config(inputs["args"])
    x, post, comb = hc_pre(inputs["h"], inputs["fn"], inputs["scale"], inputs["base"], args,
                           settings["mode"], dispatch_first=settings["dispatch_first"])
    a, n = inputs["rows"]
    return torch.cat((x, post, comb.flatten(1)), 1)[a:a + n]


def rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row ‖b − a‖ / ‖a‖."""
    a, b = a.reshape(a.shape[0], -1).double(), b.reshape(b.shape[0], -1).double()
    den = a.norm(dim=1)
    return (b - a).norm(dim=1) / torch.where(den > 0, den, torch.ones_like(den))


def kernel_parts(inputs: dict[str, Any], good: dict[str, Any], bad: dict[str, Any]
                 ) -> tuple[str, dict[str, float]]:
    """Which part of the split-K kernel moves its output: the bad end's kernel with one knob
    set to the good end's (the partials' dtype, the merge); the knob that removes (nearly) all
    of the divergence names the part. Needs both ends split (else: the kernel as a whole)."""
    ref = run_op("attn.sparse_attention", inputs, good)
    whole = float(rel(ref, run_op("attn.sparse_attention", inputs, bad)).mean())
    figures = {"kernel": whole}
    if good["split"] is None or bad["split"] is None or whole == 0.0:
        return "attn.sparse_attention", figures
    for knob, part in (("merge", "attn.sparse_attention.merge"),
                       ("partial", "attn.sparse_attention.partials")):
        if good[knob] == bad[knob]:
            continue
        left = float(rel(ref, run_op("attn.sparse_attention", inputs,
                                     {**bad, knob: good[knob]})).mean())
        figures[f"with the good end's {knob}"] = left
        if left <= PARTS_FLOOR * whole:
            return part, figures
    return "attn.sparse_attention", figures


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m dsv4bisect.localise.repro FIRST_DIVERGENCE.pt", file=sys.stderr)
        return 5
    saved = torch.load(args[0], weights_only=False, map_location="cpu")
    op, inputs, settings = saved["op"], saved.get("repro_inputs"), saved["settings"]
    print(f"{saved['module']} {op} (layer {saved['layer']}), sequence {saved['seq']}, "
          f"forward {saved['forward']}, first positions {saved['positions'][:8]}")
    if inputs is None:
        print("no op-level recompute for this op: compare the saved outputs")
        d = rel(saved["outputs"]["good"], saved["outputs"]["bad"])
    else:
        kind = op.split(".sparse_attention")[0] + ".sparse_attention" if \
            op.startswith("attn.sparse_attention") else op
        out = {end: run_op(kind, inputs, settings[end]) for end in ("good", "bad")}
        d = rel(out["good"], out["bad"])
        print(f"settings: good {settings['good']}  bad {settings['bad']}")
        if kind == "attn.sparse_attention":
            part, figures = kernel_parts(inputs, settings["good"], settings["bad"])
            print(f"kernel parts: {part}: " + ", ".join(f"{k} {v:.3g}" for k, v in
                                                       figures.items()))
    worst = int(torch.argmax(d))
    print(f"relative difference per row: mean {float(d.mean()):.3g}, max {float(d.max()):.3g} "
          f"(row {worst}), rows differing {int((d > 0).sum())} of {d.numel()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
