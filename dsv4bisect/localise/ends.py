"""The two configurations `localise` compares: the bad end and the good end = the bad end with the
culprit reverted.

- `localise PROFILE [--only/--enable/--disable/--set]`: the bad end is what `run` would launch
  for the same flags. The culprit is what the flags changed against the profile as written:
  the patches whose state they changed (`--only P`: P, and the good end has every other patch
  off too, as `run`'s good end), else the non-patch `--set`s (`--set
  engine.chunked_prefill_size=512`). `--culprit P,Q` names it instead, against the bad end.
- `localise BISECT_DIR`: the bad end is the bisect's, the culprit the set it found (read by
  `bisect/localise_input.py`); the good end is the bad end without it (not the all-off end,
  whose first divergence would be another patch's own op).

**A culprit running a fault variant** (`--set patches.P.variant=V`, V a field fault of P) is
reverted to P's default variant, not to P off, unless `revert="patch"`: the fault is the
difference between V and the patch as it is meant to be, and P off would put the patch's own
numerics between the ends first (measured on the shipped checkpoint: `mma-decode:split-k`
against off leaves the good end's numbers at layer 0's sparse attention, ×2e4 its envelope,
before any fault of `mma-decode` acts at layers 2-3). The report says which revert was used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.errors import ConfigError

REVERTS = ("fault", "patch")


@dataclass(frozen=True)
class Culprit:
    """What the good end reverts: patches (name -> (good variant or None = off, bad variant or
    None = off)) and non-patch settings (`--set` items)."""

    patches: Mapping[str, tuple[str | None, str | None]] = field(default_factory=dict)
    settings: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = [f"{n}: {b or 'off'} -> {g or 'off'}" for n, (g, b) in self.patches.items()]
        return "; ".join(parts + [f"--set {s} reverted" for s in self.settings]) or "nothing"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.patches) + tuple(s.partition("=")[0] for s in self.settings)


@dataclass(frozen=True)
class Ends:
    good: EngineConfig
    bad: EngineConfig
    culprit: Culprit
    revert: str  # fault | patch
    how: str  # one sentence: how the good end was chosen


def _patch_sets(sets: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    patch = tuple(s for s in sets if s.strip().startswith("patches."))
    return patch, tuple(s for s in sets if not s.strip().startswith("patches."))


def configuration(profile: str, patches: Mapping[str, str], sets: Sequence[str]) -> EngineConfig:
    """The profile with exactly `patches` on (name -> variant) and the non-patch `sets`."""
    variant_sets = [f"patches.{n}.variant={v}" for n, v in patches.items()]
    cfg = resolve(profile, Overrides(sets=(*sets, *variant_sets), only=tuple(patches)))
    if cfg.patch_set != dict(patches):
        raise ConfigError(f"`{profile}` cannot run the patch set {dict(patches)} "
                          f"(it resolves to {cfg.patch_set})",
                          "a patch is masked by another or required; name the culprit with "
                          "--culprit")
    return cfg


def _reverted(bad: EngineConfig, names: Sequence[str], revert: str
              ) -> tuple[dict[str, str], dict[str, tuple[str | None, str | None]]]:
    """The bad end's patch set with `names` reverted; and the culprit's (good, bad) states."""
    default = {p.name: p.variant for p in bad.available}
    faults = {p.name for p in bad.patches if p.fault}
    good = dict(bad.patch_set)
    culprit: dict[str, tuple[str | None, str | None]] = {}
    for name in names:
        was = good.get(name)
        if name in faults and revert == "fault":
            good[name] = default[name]
        else:
            good.pop(name, None)
        culprit[name] = (good.get(name), was)
    return good, culprit


def profile_ends(profile: str, overrides: Overrides, *, culprit: Sequence[str] | None = None,
                 revert: str = "fault") -> Ends:
    """The ends of `localise PROFILE` (see the module doc)."""
    if revert not in REVERTS:
        raise ConfigError(f"--revert {revert}: unknown", f"use one of: {', '.join(REVERTS)}")
    bad = resolve(profile, overrides)
    patch_sets, other_sets = _patch_sets(overrides.sets)
    if culprit:
        unknown = [n for n in culprit if n not in {p.name for p in bad.available}]
        if unknown:
            raise ConfigError(f"--culprit {unknown[0]}: not a patch of `{profile}`",
                              "name patches of the profile (`dsv4bisect patches list`)")
        good_patches, states = _reverted(bad, culprit, revert)
        good = configuration(profile, good_patches, other_sets)
        return _checked(Ends(good, bad, Culprit(states), revert,
                             f"the bad end with {', '.join(culprit)} reverted"))
    touched = bool(overrides.only is not None or overrides.enable or overrides.disable
                   or patch_sets)
    if not touched:
        if not other_sets:
            raise ConfigError("nothing to localise: the flags change nothing against "
                              f"`{profile}`", "name the culprit: --only P, --enable P, "
                              "--set patches.P.variant=V, --set KEY=VALUE or --culprit P")
        good = resolve(profile, Overrides())
        return _checked(Ends(good, bad, Culprit({}, other_sets), revert,
                             "the profile without the --set overrides"))
    if overrides.only is not None:  # run's good end: every patch off but the required ones
        base = {p.name: p.variant for p in bad.available if p.required}
    else:
        base = resolve(profile, Overrides(sets=other_sets)).patch_set
    names = [n for n in dict.fromkeys([*base, *bad.patch_set]) if
             base.get(n) != bad.patch_set.get(n)]
    faults = {p.name for p in bad.patches if p.fault}
    good_patches = dict(base)
    for name in names:
        if name in faults and revert == "fault":
            good_patches[name] = {p.name: p.variant for p in bad.available}[name]
    states = {n: (good_patches.get(n), bad.patch_set.get(n)) for n in names}
    good = configuration(profile, good_patches, other_sets)
    how = ("every patch off but the required ones" if overrides.only is not None
           else "the profile's own patches")
    if any(n in faults for n in names) and revert == "fault":
        how += ", a fault-variant culprit at its patch's default variant (the fault reverted)"
    return _checked(Ends(good, bad, Culprit(states), revert, how))


def bisect_ends(profile: str, sets: Sequence[str], bad_patches: Mapping[str, str],
                culprit: Sequence[str], revert: str = "fault") -> Ends:
    """The ends of `localise BISECT_DIR`: the bisect's bad end and it without the culprit."""
    _, other_sets = _patch_sets(sets)
    bad = configuration(profile, bad_patches, other_sets)
    good_patches, states = _reverted(bad, culprit, revert)
    good = configuration(profile, good_patches, other_sets)
    return _checked(Ends(good, bad, Culprit(states), revert,
                         f"the bisect's bad end with {', '.join(culprit)} reverted"))


def _checked(ends: Ends) -> Ends:
    bad = ends.bad
    if bad.kind not in ("reference", "sglang"):
        raise ConfigError(f"`{bad.profile}` runs a `{bad.kind}` engine: localise reads the "
                          "embedded engine in-process or SGLang through its own dumper",
                          "localise the same patches on an embedded or SGLang profile "
                          "(`--only P` on `reference`)")
    if bad.entry_role != "server":  # a PD set: prefill, decode and router processes
        raise ConfigError(f"`{bad.profile}` is a PD deployment ({bad.entry_role} in front of "
                          "prefill and decode servers): localise compares one server's "
                          "forwards and restored state, not a transfer between two",
                          "localise the same patches on the monolithic profile (`reference` "
                          "for `reference-pd`); a transfer fault is bisected by `run`/`bisect`")
    for name, cfg in (("bad end", ends.bad), ("good end", ends.good)):
        if cfg.cannot_start:
            raise ConfigError(f"the {name} cannot start: {cfg.cannot_start}",
                              "enable the required patch")
    if ends.good.fingerprint == ends.bad.fingerprint:
        raise ConfigError("the good and bad ends are the same configuration "
                          f"({ends.bad.fingerprint[:12]})",
                          "the culprit changes nothing here (an inert patch?); "
                          "`dsv4bisect diff-config` shows what differs")
    return ends
