"""The two ends of a run: the candidate configuration, its good end, and the probe spec.

The good end is the same profile with every patch off except the required ones (and any the
profile's `bisect.good` names): `Overrides(sets=<the user's --set>, only=<those names>)`, and
a PD pair's per-role patches removed. The
user's `--set` overrides apply to both ends, except `patches.*` keys: those choose the
candidate's patches (`--set patches.P.variant=V` enables P), and the good end keeps a required
patch at its default variant. `--enable/--disable/--only` shape the candidate only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.spec import ProbeSpec, tier_spec, with_concurrency


@dataclass(frozen=True)
class Ends:
    good: EngineConfig
    candidate: EngineConfig
    good_overrides: Overrides


def resolve_ends(profile: str, overrides: Overrides) -> Ends:
    """Both configurations; one that cannot start is a `ConfigError` (exit 5), never launched."""
    candidate = resolve(profile, overrides)
    good_ov = good_overrides(candidate, overrides)
    good = resolve(profile, good_ov)
    for name, cfg in (("candidate", candidate), ("good end", good)):
        if cfg.cannot_start:
            raise ConfigError(f"the {name} configuration cannot start: {cfg.cannot_start}",
                              "enable the required patch (it is never launched without it)")
    return Ends(good, candidate, good_ov)


def good_overrides(candidate: EngineConfig, user: Overrides) -> Overrides:
    """Required patches (plus the profile's `bisect.good`) on, everything else off."""
    names = [p.name for p in candidate.available if p.required]
    names += [n for n in (candidate.bisect.get("good") or []) if n not in names]
    sets = tuple(s for s in user.sets if not s.strip().startswith("patches."))
    # a PD pair's own patches per role (engine.pd.<role>.patches) are patches too: off
    roles = tuple(f"engine.pd.{p.role}.patches" for p in candidate.processes
                  if p.role in ("prefill", "decode"))
    return Overrides(sets=sets, only=tuple(names), unset=roles)


def probe_spec(cfg: EngineConfig, tier: str | None = None) -> ProbeSpec:
    """The profile's probe settings over its tier's preset (`--tier` wins over `probe.tier`).

    A setting left at its schema default keeps the tier's value (provenance says `default`), so
    `probe.request_timeout_s` does not silently replace a tier's own timeout.
    """
    settings: dict[str, Any] = cfg.probe
    spec = tier_spec(tier or settings.get("tier") or "smoke")
    given = {k.split(".", 1)[1]: settings[k.split(".", 1)[1]] for k, where in cfg.provenance.items()
             if k.startswith("probe.") and where != "default" and k != "probe.tier"
             and k.split(".", 1)[1] in settings}
    changes: dict[str, Any] = {}
    for key, field in (("families", "families"), ("lengths", "lengths"), ("depths", "depths"),
                       ("seed", "seed"), ("thinking", "thinking"),
                       ("request_timeout_s", "timeout_s"),
                       ("warmup_requests", "warmup_requests")):
        if key in given and given[key] is not None:
            value = given[key]
            changes[field] = tuple(value) if isinstance(value, list) else value
    if "warm" in given:  # the warm arm on or off; the tier's other arms stay
        arms = tuple(a for a in spec.arms if a != "warm")
        changes["arms"] = (arms[0], "warm", *arms[1:]) if given["warm"] else arms
    spec = spec.replace(**changes) if changes else spec
    levels = given.get("concurrency")
    return with_concurrency(spec, tuple(levels) if levels else None)
