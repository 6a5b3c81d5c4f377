"""Rendering `localise`'s result: its JSON pieces from the judged sites, the markdown report a
maintainer acts on, the per-layer divergence plot and the layer × position heatmap (PNG,
matplotlib optional). Pure but for the files it writes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dsv4bisect.localise import ops
from dsv4bisect.localise.judge import Localisation, SiteResult
from dsv4bisect.localise.result import Divergence, LayerPicture, LocaliseResult, StateCheck

MAX_BINS = 256  # positions per heatmap row


def _finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None


def divergence(r: SiteResult, cases: Mapping[int, str], kind: str) -> Divergence:
    """A judged site as the JSON's divergence."""
    info = ops.BY_NAME.get(r.site.op)
    seq = r.judged.outside[0][0] if r.judged.outside else (
        int(r.compared.seqs[int(np.argmax(r.compared.d))]) if len(r.compared.d) else None)
    positions = [p for s, p in r.judged.outside if s == seq]
    if not positions and seq is not None:  # the mean left the envelope, no single position did
        mine = r.compared.seqs == seq
        top = np.argsort(-r.compared.d[mine], kind="stable")[:8]
        positions = sorted(int(p) for p in r.compared.positions[mine][top])
    module, op, what = r.site.module, r.site.op, info.what if info else r.site.op
    if r.site.is_input and "." in module:
        # a module's input left its envelope, its producer recorded nothing: the divergence
        # is in the code of the module that computed it (the call's parent), before the call
        parent = module.rsplit(".", 1)[0]
        what = (f"in {parent}'s own code, before it calls {module} (whose input "
                f"{r.site.slot} is the first tensor outside its envelope)")
        module, op = parent, f"{op}.{r.site.slot}"
    return Divergence(
        layer=r.site.layer, module=module, op=op, what=what, kind=kind,
        multiple=_finite(r.judged.multiple), inputs_multiple=_finite(r.inputs_multiple),
        case=None if seq is None else cases.get(seq, str(seq)), positions=positions,
        site=r.site.key, mean=r.judged.mean, envelope=r.judged.envelope.bound,
        acts_on=list(info.acts_on) if info else [])


def alignment(loc: Localisation) -> dict[str, object] | None:
    """The maintainers' first step: the embedding output must be bit-identical, or the two runs
    did not compute the same tokens at the same positions (nothing after it can be compared)."""
    first = next((r for r in loc.sites if not r.site.is_input and (
        r.site.op == "embed" or r.site.module.endswith(("embed", "embed_tokens")))), None)
    if first is None:
        return None
    return {"site": first.site.key, "bit_identical": bool(not first.compared.d.any()),
            "positions": len(first.compared.d)}


def state_check(check: str, loc: Localisation | None, cases: Mapping[int, str]
                ) -> StateCheck | None:
    if loc is None:
        return None
    first = None if loc.first is None else divergence(loc.first, cases, "state")
    return StateCheck(check=check, first=first,
                      sites_outside=sum(r.judged.is_outside for r in loc.sites),
                      sites=len(loc.sites))


def downstream(loc: Localisation) -> list[LayerPicture]:
    """Per layer (in order; sites outside the layers last): the largest multiple and the
    sites outside their envelope."""
    by_layer: dict[int | None, list[SiteResult]] = {}
    for r in loc.sites:
        by_layer.setdefault(r.site.layer, []).append(r)
    keys = sorted(k for k in by_layer if k is not None) + ([None] if None in by_layer else [])
    return [LayerPicture(layer=k, max_multiple=max(r.judged.multiple for r in by_layer[k]),
                         sites_outside=sum(r.judged.is_outside for r in by_layer[k]),
                         sites=len(by_layer[k])) for k in keys]


def heatmap_values(loc: Localisation, seq: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Layers, position bin edges and [layers, bins] of the largest d / envelope over a layer's
    sites, for sequence `seq`."""
    layers = sorted({r.site.layer for r in loc.sites if r.site.layer is not None})
    positions = [r.compared.positions[r.compared.seqs == seq] for r in loc.sites]
    top = max((int(p.max()) for p in positions if len(p)), default=0) + 1
    edges = np.linspace(0, top, min(MAX_BINS, top) + 1)
    grid = np.zeros((len(layers), len(edges) - 1))
    row = {layer: i for i, layer in enumerate(layers)}
    for r in loc.sites:
        if r.site.layer is None:
            continue
        mine = r.compared.seqs == seq
        ratio = r.compared.d[mine] / r.judged.envelope.bound
        b = np.clip(np.searchsorted(edges, r.compared.positions[mine], side="right") - 1,
                    0, len(edges) - 2)
        np.maximum.at(grid[row[r.site.layer]], b, ratio)
    return layers, edges, grid


def write_plots(loc: Localisation, seq: int | None, out: Path) -> dict[str, str]:
    """divergence_by_layer.png and heatmap.png (nothing without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    files = {}
    picture = [p for p in downstream(loc) if p.layer is not None]
    if picture:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        ax.semilogy([p.layer for p in picture], [max(p.max_multiple, 1e-3) for p in picture],
                    "o-")
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("layer")
        ax.set_ylabel("largest multiple of the envelope")
        ax.set_title("divergence by layer (bad end against the good end)")
        fig.tight_layout()
        fig.savefig(out / "divergence_by_layer.png", dpi=110)
        plt.close(fig)
        files["per_layer_png"] = "divergence_by_layer.png"
    if seq is not None:
        layers, edges, grid = heatmap_values(loc, seq)
        if layers and grid.size:
            fig, ax = plt.subplots(figsize=(8, 0.5 * len(layers) + 1.5))
            top = max(1.0, float(np.log10(max(grid.max(), 1e-3))))
            img = ax.imshow(np.log10(np.maximum(grid, 1e-3)), aspect="auto", origin="lower",
                            extent=(edges[0], edges[-1], -0.5, len(layers) - 0.5),
                            cmap="magma", interpolation="nearest", vmin=-3, vmax=top)
            ax.set_yticks(range(len(layers)), [str(x) for x in layers])
            ax.set_xlabel("position")
            ax.set_ylabel("layer")
            fig.colorbar(img, ax=ax, label="log10(divergence / envelope)")
            fig.tight_layout()
            fig.savefig(out / "heatmap.png", dpi=110)
            plt.close(fig)
            files["heatmap_png"] = "heatmap.png"
    return files


def markdown(res: LocaliseResult) -> str:
    """report.md: what a maintainer acts on."""
    lines = [f"# localise: {res.profile}" + (f" (bisect {res.bisect_dir})" if res.bisect_dir
                                              else ""), ""]
    lines += [f"- engine: {res.engine}; culprit: {res.culprit} (revert: {res.revert})",
              f"- good end: {res.good_end_how}"]
    for name, end in res.ends.items():
        listing = ", ".join(f"{k}:{v}" for k, v in end.patches.items()) or "no patch"
        lines.append(f"- {name} end: fingerprint `{end.fingerprint[:16]}`, {listing}")
    lines.append("- cases: " + "; ".join(f"{c.case_id} ({c.tokens} tokens, {c.why})"
                                         for c in res.cases))
    lines.append(f"- null arms (the envelope): {', '.join(res.null_arms) or 'none'}")
    if res.alignment is not None:
        same = "bit-identical" if res.alignment["bit_identical"] else \
            "NOT bit-identical: the runs are not aligned, nothing after it compares"
        lines.append(f"- alignment: the embedding (`{res.alignment['site']}`) is {same}")
    lines += ["", "## First divergence", ""]
    f = res.first_divergence
    if f is None:
        lines.append("None: every site of the bad end stays inside the good end's envelope"
                     + (", and the state and speculative checks found nothing." if res.state
                        else "."))
    else:
        where = "outside the layers" if f.layer is None else f"layer {f.layer}"
        lines += [f"**{f.module} — `{f.op}`** ({f.kind}, {where}): {f.what}.", ""]
        if f.mean is not None and f.multiple is not None:
            inp = "n/a" if f.inputs_multiple is None else f"×{f.inputs_multiple:.3g}"
            lines.append(f"- ×{f.multiple:.3g} its envelope (mean divergence {f.mean:.3g} "
                         f"against {f.envelope:.3g}); its inputs {inp}")
        lines += [f"- first positions ({f.case}): {f.positions[:8]}",
                  f"- code of: {', '.join(f.acts_on) or 'no patch (see the op table)'}"]
        if f.parts:
            lines.append("- the kernel's parts: " + ", ".join(f"{k} {v:.3g}"
                                                           for k, v in f.parts.items()))
        if f.detail:
            lines.append(f"- {spec_round(f.detail)}")
    if res.state is not None:
        s = res.state.first
        lines += ["", f"## State: {res.state.check}", "",
                  "No state site outside its envelope." if s is None else
                  f"**{s.module} — `{s.op}`** ×{s.multiple:.3g}, first positions ({s.case}): "
                  f"{s.positions[:8]} ({res.state.sites_outside} of {res.state.sites} state "
                  "sites outside)"]
    if res.speculation is not None and res.speculation is not f:
        lines += ["", "## Speculation", "", spec_round(res.speculation.detail or {})]
    if res.downstream:
        lines += ["", "## Downstream", "", "| layer | largest multiple | sites outside |",
                  "| ---: | ---: | ---: |"]
        lines += [f"| {p.layer if p.layer is not None else '-'} | {p.max_multiple:.3g} | "
                  f"{p.sites_outside} / {p.sites} |" for p in res.downstream]
    if res.files:
        lines += ["", "## Files", ""]
        lines += [f"- {k}: `{v}`" for k, v in res.files.items()]
        if "per_layer_png" in res.files:
            lines.append(f"\n![divergence by layer]({res.files['per_layer_png']})")
        if "heatmap_png" in res.files:
            lines.append(f"\n![layer × position]({res.files['heatmap_png']})")
    if res.comparator:
        lines += ["", "Cross-check with SGLang's own comparator:", "", "```",
                  res.comparator, "```"]
    for note in res.notes:
        lines += ["", f"> {note}"]
    return "\n".join(lines) + "\n"


def spec_round(d: Mapping[str, object]) -> str:
    """A speculative round in words."""
    return (f"round {d.get('round')} of {d.get('case_id')}, after {d.get('position')} output "
            f"tokens: the MTP layer drafted {d.get('drafts')}, the main model's argmax at the "
            f"verify rows was {d.get('verify_argmax')}; greedy verification takes "
            f"{d.get('greedy')}, the configuration took {d.get('chosen')}")


def first_of(candidates: Sequence[Divergence | None]) -> Divergence | None:
    return next((c for c in candidates if c is not None), None)
