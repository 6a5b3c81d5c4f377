"""The op-level repro: the first divergent op alone, on the good end's inputs of the forward where
it first left its envelope, under both configurations — the seeds' "micro-tests on real
tensors". One command: `python -m dsv4bisect.localise.repro REPORT_DIR/first_divergence.pt`.

`build` reads the op's inputs from a save pass (`capture.Recorder` with `keep`: the raw tensors
of the divergent layer's sites, per forward); `op_settings` says what each configuration puts
at the op's swappable place (its patch set, precision and MoE runner: `reference/swappable.py`
builds the implementation from them, the code the engine ran), and `run_op` runs that
implementation on the inputs. Built for the ops whose code a patch swaps in the attention and
mHC: the sparse attention (and, for two split-K configurations, its parts: with one setting of
the bad end's kernel set to the good end's, which one brings its output back names
`attn.sparse_attention.partials` or `.merge`), `wo_a` and the mHC pre sites. Other ops keep
their saved rows in the file and say that no recompute exists.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import torch

from dsv4bisect.localise.capture import Raw, Rows

REPRO_OPS = ("attn.sparse_attention", "attn.wo_a", "mhc.pre_attn", "mhc.pre_ffn")
PARTS_FLOOR = 0.01  # a setting "brings the output back" when 1 % or less of the divergence is left


def op_settings(op: str, numerics: Any, model: Any, layer: int) -> dict[str, Any]:
    """What configuration `numerics` puts at op `op`'s place in `layer` (plain data, saved in
    the repro file); for the sparse attention also its kernel's settings (split, partials'
    dtype, merge, the stock schedule's cut)."""
    settings: dict[str, Any] = {
        "layer": layer,
        "numerics": {"patches": dict(numerics.patches), "moe_backend": numerics.moe_backend,
                     "precision": numerics.precision,
                     "nvfp4_layers": None if numerics.nvfp4_layers is None
                     else sorted(numerics.nvfp4_layers)}}
    if op == "attn.sparse_attention":
        impl = _place(op, settings, model.a, model.layers[layer].attn.ratio)
        settings["kernel"] = dict(impl.kernel)
    return settings


def _place(op: str, settings: dict[str, Any], args: Any, ratio: int = 1) -> Any:
    """The implementation configuration `settings` runs at op `op`'s place (stock or a
    patch's), built as `Transformer.configure` builds it."""
    from dsv4bisect.patchspec.swaps import Op
    from dsv4bisect.reference.config import Numerics
    from dsv4bisect.reference.swappable import (
        PatchSwaps,
        stock_attention,
        stock_mixes,
        stock_wo_a_input,
    )

    n, layer = settings["numerics"], settings["layer"]
    numerics = Numerics(n["patches"], n["moe_backend"],
                        None if n["nvfp4_layers"] is None else frozenset(n["nvfp4_layers"]),
                        n["precision"])
    deploy = numerics.deployment
    place, stock = {
        "attn.sparse_attention": (Op.ATTENTION, lambda: stock_attention(deploy, ratio)),
        "attn.wo_a": (Op.WO_A_INPUT, lambda: stock_wo_a_input(deploy)),
        "mhc.pre_attn": (Op.MHC_MIXES, lambda: stock_mixes(
            args, deploy, layer == 0 or layer >= args.num_hidden_layers)),
        "mhc.pre_ffn": (Op.MHC_MIXES, lambda: stock_mixes(args, deploy, False)),
    }[op]
    return PatchSwaps(numerics, args).value(place, stock(), layer)


def _group(raw: Raw, forward: int, seq: int) -> torch.Tensor | None:
    return next((t for f, s, t in raw.parts if f == forward and s == seq), None)


def _full(raw: Raw, forward: int) -> torch.Tensor | None:
    return next((t for f, _, t in raw.parts if f == forward), None)


def _rows_of(layout: tuple[Rows, ...], seq: int) -> tuple[int, int] | None:
    """Where sequence `seq`'s rows are in the forward: (first row, count)."""
    at = 0
    for r in layout:
        if r.seq == seq:
            return at, r.n
        at += r.n
    return None


def build(op: str, module: str, raws: dict[str, Raw], layout: tuple[Rows, ...], forward: int,
          seq: int, model: Any) -> dict[str, Any] | None:
    """The op's inputs (the good end's, from its save pass) in `forward`, the whole forward's
    (a stock kernel's schedule or a layout fault reads other sequences' rows), with `rows`:
    where sequence `seq`'s are. None when the save pass did not record what the op needs."""
    layer = int(module.split(".")[1])
    where = _rows_of(layout, seq)
    if where is None:
        return None
    common = {"rows": where, "group": [r.seq for r in layout].index(seq),
              "args": model.a.to_hf_config()}
    if op == "attn.sparse_attention":
        q = _full(raws.get(f"{module}:attn.q:0", Raw()), forward)
        # every sequence's group (one sequence each): its key pool, lists and window rows
        groups = [tuple(_group(raws.get(f"{module}:attn.key_pool:{i}", Raw()), forward, r.seq)
                        for i in range(3)) for r in layout]
        if q is None or any(t is None for g in groups for t in g):
            return None
        attn = model.layers[layer].attn
        positions = torch.cat([torch.arange(r.start, r.start + r.n) for r in layout])
        return {**common, "q": q, "groups": groups, "positions": positions,
                "sink": attn.attn_sink.detach().clone(), "scale": q.shape[-1] ** -0.5,
                "ratio": attn.ratio}
    if op == "attn.wo_a":
        o = _full(raws.get(f"{module}:attn.o:0", Raw()), forward)
        if o is None:
            return None
        attn = model.layers[layer].attn
        a = attn.a
        weight = attn.wo_a.value().detach().view(a.o_groups, a.o_lora_rank, -1).clone()
        return {**common, "o": o, "weight": weight}
    if op in ("mhc.pre_attn", "mhc.pre_ffn"):
        # its input h: the block's input (the attention site) or the attention's mHC post's
        # output (the MoE site), recorded under whichever site saw the tensor first
        sources = ([f"{module}:block:in0"] if op == "mhc.pre_attn"
                   else [f"{module}:mhc.post_attn:0"]) + [f"{module}:{op}:in0"]
        h = _full(next((raws[k] for k in sources if k in raws), Raw()), forward)
        if h is None:
            return None
        site = "attn" if op == "mhc.pre_attn" else "ffn"
        block = model.layers[layer]
        return {**common, "h": h, **{k: getattr(block, f"hc_{site}_{k}").detach().clone()
                                     for k in ("fn", "scale", "base")}}
    return None


def run_op(op: str, inputs: dict[str, Any], settings: dict[str, Any]) -> torch.Tensor:
    """The op alone on `inputs` under one configuration's `settings` -> sequence's output rows."""
    from dsv4bisect.reference.config import ModelArgs
    from dsv4bisect.reference.model import Ops, hc_pre
    from dsv4bisect.reference.swappable import KeyList

    args = ModelArgs.from_hf_config(inputs["args"])
    a, n = inputs["rows"]
    if op == "attn.sparse_attention":
        q = inputs["q"]
        lists, row = [], 0
        for pool, idx, window in inputs["groups"]:
            T = idx.shape[1]
            local = idx.reshape(T, -1)  # one sequence a group: its own pool is the flat one
            lists.append(KeyList(slice(row, row + T), pool.reshape(-1, pool.shape[-1]), local,
                                 local, int(window[0])))
            row += T
        step = SimpleNamespace(ops=Ops.for_device(q.device), token_positions=inputs["positions"])
        impl = _place(op, settings, args, inputs["ratio"])
        return impl(q, lists, inputs["sink"], inputs["scale"], step)[a:a + n]
    if op == "attn.wo_a":
        o = _place(op, settings, args)(inputs["o"])
        return torch.einsum("tgd,grd->tgr", o, inputs["weight"]).reshape(o.shape[0], -1)[a:a + n]
    x, post, comb = hc_pre(inputs["h"], inputs["fn"], inputs["scale"], inputs["base"], args,
                           _place(op, settings, args))
    return torch.cat((x, post, comb.flatten(1)), 1)[a:a + n]


def kernel_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """The sparse attention's inputs of the sequence `build` was asked for: its queries, its
    key pool flattened, its lists into it, the sink and scale."""
    pool, idx, _ = inputs["groups"][inputs["group"]]
    a, n = inputs["rows"]
    return {"q": inputs["q"][a:a + n], "kv": pool.reshape(-1, pool.shape[-1]),
            "indices": idx.reshape(n, -1), "sink": inputs["sink"], "scale": inputs["scale"]}


def kernel(inputs: dict[str, Any], knobs: dict[str, Any]) -> torch.Tensor:
    """The split-K kernel (or one fp32 pass: `split` None) with settings `knobs` on one
    sequence's `kernel_inputs`."""
    from dsv4bisect.kernels.sparse_attention import sparse_attention_ref

    return sparse_attention_ref(inputs["q"], inputs["kv"], inputs["indices"].int(),
                                inputs["sink"], inputs["scale"], split=knobs["split"],
                                partial_dtype=getattr(torch, knobs["partial"]),
                                merge=knobs["merge"])


def rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row ‖b − a‖ / ‖a‖."""
    a, b = a.reshape(a.shape[0], -1).double(), b.reshape(b.shape[0], -1).double()
    den = a.norm(dim=1)
    return (b - a).norm(dim=1) / torch.where(den > 0, den, torch.ones_like(den))


def kernel_parts(inputs: dict[str, Any], good: dict[str, Any], bad: dict[str, Any]
                 ) -> tuple[str, dict[str, float]]:
    """Which part of the split-K kernel moves its output (`inputs`: one sequence's
    `kernel_inputs`; `good`, `bad`: each end's kernel settings): the bad end's kernel with one
    setting set to the good end's (the partials' dtype, the merge); the one that removes
    (nearly) all of the divergence names the part. Needs both ends split (else: the kernel as
    a whole)."""
    ref = kernel(inputs, good)
    whole = float(rel(ref, kernel(inputs, bad)).mean())
    figures = {"kernel": whole}
    if good["split"] is None or bad["split"] is None or whole == 0.0:
        return "attn.sparse_attention", figures
    for knob, part in (("merge", "attn.sparse_attention.merge"),
                       ("partial", "attn.sparse_attention.partials")):
        if good[knob] == bad[knob]:
            continue
        left = float(rel(ref, kernel(inputs, {**bad, knob: good[knob]})).mean())
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
        rows = saved["outputs_by_position"]
        d = rel(rows["good"]["rows"], rows["bad"]["rows"])
    else:
        kind = op.split(".sparse_attention")[0] + ".sparse_attention" if \
            op.startswith("attn.sparse_attention") else op
        out = {end: run_op(kind, inputs, settings[end]) for end in ("good", "bad")}
        d = rel(out["good"], out["bad"])
        print(f"settings: good {settings['good']}  bad {settings['bad']}")
        if kind == "attn.sparse_attention":
            part, figures = kernel_parts(kernel_inputs(inputs), settings["good"]["kernel"],
                                         settings["bad"]["kernel"])
            print(f"kernel parts: {part}: " + ", ".join(f"{k} {v:.3g}" for k, v in
                                                       figures.items()))
    worst = int(torch.argmax(d))
    print(f"relative difference per row: mean {float(d.mean()):.3g}, max {float(d.max()):.3g} "
          f"(row {worst}), rows differing {int((d > 0).sum())} of {d.numel()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
