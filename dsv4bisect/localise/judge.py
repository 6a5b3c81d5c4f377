"""The answer: the first site, in execution order, whose output leaves its envelope while its
inputs stay inside theirs — the maintainers' rule ("the first module whose inputs match and
whose output does not", field-update §3), with each site's own A/A envelope instead of bit
equality (`stats.py`). Pure.

Sites are judged in the good end's execution order (the order their first rows were recorded:
layer by layer, and inside a layer as the forward runs). A site's inputs are the sites that fed
it (`Site.inputs`); `inputs_multiple` is the largest of their multiples. The first site outside
its envelope has, by construction, every earlier site inside; its inputs are among them when
they were recorded at all, which `inputs_multiple` shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dsv4bisect.localise.sites import Capture, Compared, Site, compare_site
from dsv4bisect.localise.stats import Judged, envelope, judge


@dataclass(frozen=True)
class SiteResult:
    site: Site
    judged: Judged
    inputs_multiple: float | None  # None: no input of it was recorded
    compared: Compared  # the candidate's per-position divergence (the downstream picture)


@dataclass(frozen=True)
class Localisation:
    sites: tuple[SiteResult, ...]  # every judged site, in execution order
    first: SiteResult | None  # the first outside its envelope with its inputs inside

    def by_key(self) -> dict[str, SiteResult]:
        return {r.site.key: r for r in self.sites}


def null_comparisons(good: Capture, arm: str, other: Capture
                     ) -> dict[str, tuple[str, Compared]]:
    """One null arm's capture against the good end's, per compared site."""
    out = {}
    for site in good.ordered():
        if site.compared:
            c = compare_site(good, other, site.key)
            if c is not None:
                out[site.key] = (arm, c)
    return out


def localise(good: Capture, bad: Capture,
             null: Mapping[str, Sequence[tuple[str, Compared]]]) -> Localisation:
    """Judge every site both runs recorded against its envelope from `null` (site key -> the
    null arms' comparisons with the good end) and find the first divergence."""
    pairs = []
    for site in good.ordered():
        if not site.compared or site.key not in bad.rows:
            continue
        c = compare_site(good, bad, site.key)
        if c is not None and len(c.d):
            pairs.append((site, c))
    tests = max(1, len(pairs))
    judged = {site.key: (site, judge(c, envelope(site.key, null.get(site.key, ()), len(c.d),
                                                  tests, float(c.d.mean()))), c)
              for site, c in pairs}
    results = []
    for site, j, c in judged.values():
        multiples = [judged[k][1].multiple for k in site.inputs if k in judged]
        results.append(SiteResult(site, j, max(multiples) if multiples else None, c))
    first = next((r for r in results if r.judged.is_outside
                  and (r.inputs_multiple is None or r.inputs_multiple <= 1.0)), None)
    return Localisation(tuple(results), first)
