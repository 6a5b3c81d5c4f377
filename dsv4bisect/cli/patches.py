"""`dsv4bisect patches list|show`: the built-in patches and what each one does."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.table import Table

from dsv4bisect.cli.options import Disable, Enable, Json, Only, Set, overrides
from dsv4bisect.errors import ConfigError
from dsv4bisect.patching.registry import builtin_patches, get_patch
from dsv4bisect.ui.console import stdout

patches_app = typer.Typer(help="List the patches and show what each one does (alone: "
                               "`patches list`).", invoke_without_command=True)


@patches_app.callback()
def _alone(ctx: typer.Context) -> None:
    """`dsv4bisect patches` with no subcommand lists them, as `patches list` does (it used to
    print usage and exit 2)."""
    if ctx.invoked_subcommand is None:
        list_patches()


def register(app: typer.Typer) -> None:
    app.add_typer(patches_app, name="patches")


def _variants(patch) -> str:
    return ", ".join(v.name + (" (fault)" if v.fault else "") for v in patch.variants)


@patches_app.command("list")
def list_patches(
    profile: Annotated[Optional[str], typer.Option(
        "--profile", help="Show which patches are on, inert or required under this profile.")] = None,
    json_out: Json = False,
    enable: Enable = None, disable: Disable = None, only: Only = None, sets: Set = None,
) -> None:
    """List the built-in patches (and a profile's custom ones), in registry order.

    With --profile (and its overrides) also which are on, inert (with the condition) or
    required under it.
    """
    rows = [{"name": p.name, "tier": p.tier, "variants": [v.name for v in p.variants],
             "faults": [v.name for v in p.variants if v.fault],
             "citations": {v.name: v.citation for v in p.variants if v.citation},
             "summary": p.summary}
            for p in builtin_patches().values()]
    if profile is not None:
        from dsv4bisect.config.resolve import resolve

        cfg = resolve(profile, overrides(enable, disable, only, sets))
        on = cfg.patch_set
        rows = [{"name": c.name, "tier": c.tier, "variants": [c.variant], "faults": [],
                 "summary": c.summary, "enabled": c.name in on,
                 "variant": on.get(c.name), "inert": c.inert, "required": c.required}
                for c in cfg.available]
    elif enable or disable or only or sets:
        raise ConfigError("--enable/--disable/--only/--set need --profile",
                          "e.g. dsv4bisect patches list --profile reference --only mma-decode")
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title=f"patches{f' under {profile}' if profile else ''}", title_justify="left")
    table.add_column("patch")
    table.add_column("tier", justify="right")
    table.add_column("on" if profile else "variants (first = default)")
    table.add_column("summary")
    for row in rows:
        summary = row["summary"]
        if profile is None:
            third = _variants(get_patch(row["name"]))
        else:
            third = (row["variant"] or "on") if row["enabled"] else "off"
            third += " · inert" if row["inert"] else ""
            third += " · required" if row["required"] else ""
            summary += "".join(f"; {what}: {row[what]}" for what in ("inert", "required")
                               if row[what])
        table.add_row(row["name"], str(row["tier"]), third, summary)
    stdout().print(table)
    _print_setting_faults()


def _print_setting_faults() -> None:
    """The field faults a setting selects, not a patch (engine.pd.transfer_fault)."""
    from dsv4bisect.patching.transfer_faults import SETTING, TRANSFER_FAULTS

    table = Table(title=f"faults of a setting: --set {SETTING}=NAME (kind: reference with pd)",
                  title_justify="left")
    for column in ("fault", "acts on", "field", "summary"):
        table.add_column(column)
    for f in TRANSFER_FAULTS:
        table.add_row(f.name, f"{f.backend} backend" if f.backend else "every backend",
                      f.citation, f.summary)
    stdout().print(table)


@patches_app.command("matrix")
def matrix(markdown: Annotated[Optional[bool], typer.Option(
        "--markdown/--no-markdown",
        help="Print the Markdown that docs/sglang.md holds (default when stdout is not a "
             "terminal), or tables (default on a terminal).")] = None) -> None:
    """How each patch reaches every verified SGLang release, per GPU architecture.

    hook: our plugin's hooks; env VAR: an upstream switch the patch drives (off = the most exact
    path); upstream: upstream behaviour, not switchable; absent: no such path; (inert): on, but
    changes nothing there. Generated from the patch declarations.
    """
    from dsv4bisect.patching import matrix as m

    out = stdout()
    if markdown if markdown is not None else not out.is_terminal:
        print(m.markdown(), end="")
        return
    patches = list(builtin_patches().values())
    for arch in m.ARCHS:
        cols = m.columns(arch)
        table = Table(title=f"{arch.upper()}: how each patch reaches each SGLang release",
                      title_justify="left")
        table.add_column("patch")
        for a, b in cols:
            table.add_column(a if a == b else f"{a}–{b}")
        for p in patches:
            table.add_row(p.name, *(m.cell(p, a, arch).short() for a, _ in cols))
        out.print(table)
    masks = [f"{p.name} masked by {mask.by}: {mask.reason}" for p in patches
             for mask in p.masked_by]
    if masks:
        out.print("masks (while the second patch is on, the first cannot act: inert, not sent):")
        for line in masks:
            out.print(f"  {line}", markup=False, highlight=False)
    out.print("evidence per rule: dsv4bisect patches matrix --markdown (docs/sglang.md)",
              markup=False, highlight=False)


@patches_app.command("show")
def show_patch(name: Annotated[str, typer.Argument(help="Patch name.")], json_out: Json = False) -> None:
    """Show one patch: what it speeds up, its numerical risk, how to verify it, where it acts.

    `engine.pd.transfer_fault` shows the faults of the PD transfer setting."""
    from dsv4bisect.patching.transfer_faults import SETTING

    if name == SETTING:
        _show_setting_faults(json_out)
        return
    patch = get_patch(name)
    if json_out:
        print(json.dumps({
            "name": patch.name, "summary": patch.summary, "tier": patch.tier,
            "touches": list(patch.touches), "reference": patch.reference,
            "sglang_hooks": {k: list(v) for k, v in patch.sglang.hooks.items()},
            "variants": [{"name": v.name, "summary": v.summary, "fault": v.fault,
                          "citation": v.citation, "showed": v.showed}
                         for v in patch.variants],
            "inert_when": [c.reason for c in patch.inert_when],
            "required_when": [c.reason for c in patch.required_when], "doc": patch.doc,
        }, indent=2))
        return
    lines = [f"{patch.name} — {patch.summary}  (risk tier {patch.tier})", "", patch.doc.strip(),
             "", "variants:"]
    for v in patch.variants:
        lines.append(f"  {v.name}{' (FAULT)' if v.fault else ''}: {v.summary}")
        if v.citation:  # a fault from the field: where it was reported and how it showed
            lines.append(f"    field: {v.citation} — {v.showed}")
    lines += ["", f"embedded engine: {patch.reference}"]
    lines += [f"sglang {layout}: {', '.join(hooks)}" for layout, hooks in patch.sglang.hooks.items()]
    lines += [f"inert when: {c.reason}" for c in patch.inert_when]
    lines += [f"required when: {c.reason}" for c in patch.required_when]
    print("\n".join(lines))


def _show_setting_faults(json_out: bool) -> None:
    from dsv4bisect.patching.transfer_faults import SETTING, TRANSFER_FAULTS

    if json_out:
        print(json.dumps({"setting": SETTING, "faults": [
            {"name": f.name, "summary": f.summary, "backend": f.backend,
             "citation": f.citation, "showed": f.showed} for f in TRANSFER_FAULTS]}, indent=2))
        return
    lines = [f"{SETTING} — field faults of the embedded engine's PD transfer "
             "(kind: reference with engine.pd; docs/reference-engine.md, 'PD disaggregation')",
             "", "faults:"]
    for f in TRANSFER_FAULTS:
        where = f"the {f.backend} backend only" if f.backend else "every backend"
        lines += [f"  {f.name} (FAULT, {where}): {f.summary}",
                  f"    field: {f.citation} — {f.showed}"]
    print("\n".join(lines))
