"""What the registry's patches declare for vLLM (`PATCH.vllm`), gathered across patches: the
symbols the facts extractor reads on every release, the by-value importers it records and the
calls it looks up (`facts.py`), and each patch's sites, uses and call contracts for `doctor`
(`engines/vllm_checks.py`). A patch's own delivery is in its own file; nothing here names one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dsv4bisect.base.vllm_releases import LAYOUTS
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.patchspec.spec import Patch, VllmCall, VllmDelivery, VllmSite
from dsv4bisect.vllm_hooks import targets as tg


def deliveries(known: Mapping[str, Patch] | None = None) -> dict[str, VllmDelivery]:
    """patch -> its vLLM delivery, in registry order."""
    return {name: p.vllm for name, p in (known or builtin_patches()).items()}


def sites(patch: str, layout: str) -> tuple[VllmSite, ...]:
    """The patch's hook sites on this layout (none for a name outside the registry)."""
    known = builtin_patches().get(patch)
    return () if known is None else known.vllm.sites.get(layout, ())


def targets(patch: str, layout: str) -> tuple[str, ...]:
    """The patch's hook targets on this layout, then the vLLM symbols its hooks call."""
    uses = builtin_patches()[patch].vllm.uses.get(layout, ())
    return tuple(s.target for s in sites(patch, layout)) + uses


def call_contracts(layout: str, patches: Iterable[str] | None = None
                   ) -> dict[str, tuple[VllmCall, ...]]:
    """patch -> the calls in this layout's vLLM source its hooks rely on (those it declares)."""
    known = deliveries()
    names = known if patches is None else [p for p in patches if p in known]
    return {p: known[p].calls[layout] for p in names if known[p].calls.get(layout)}


def all_targets() -> list[str]:
    """Every symbol any layout declares (the facts extractor reads each on every release)."""
    names: set[str] = {tg.PLUGINS, *tg.DEFINED_AT.values()}
    for layout in LAYOUTS:
        names |= set(tg.SIGNATURES[layout])
        for d in deliveries().values():
            names |= {s.target for s in d.sites.get(layout, ())} | set(d.uses.get(layout, ()))
    return sorted(names)


def by_value_targets() -> list[str]:
    """Module-level functions hooked somewhere: their by-value importers are recorded."""
    return sorted({s.target for d in deliveries().values() for sites in d.sites.values()
                   for s in sites if s.copies})
