"""The question of `bisect PROFILE --upgrade-from OLD`: which changed switch default broke it.

The profile runs the new release. Its good end is the new release with the old release's value
of every switch both releases read whose default changed (the switch catalogs shipped per
release, patching/switch_catalog.py, at the profile's GPU architecture); its bad end is the
profile as it is. The candidates are those switches, plus the new switches that are on by
default (their good-end value is off). A switch the profile sets itself is left out (its value
did not change with the release), and so is one whose old value cannot be written (an unset
variable the new release reads as something else, a store-true flag the old release had on).

When the good end already fails, the release's code, not its switch defaults, lost the facts:
`code_bisect_hint` shows how to bisect the commits between the two release tags.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dsv4bisect.bisect.config_question import Difference, ends
from dsv4bisect.bisect.question import Question, base_sets
from dsv4bisect.bisect.setting_candidates import ABSENT, ARG, ENV
from dsv4bisect.bisect.switch_info import other_vendor
from dsv4bisect.config.diff import argv_items
from dsv4bisect.config.resolve import Overrides, load_profile, resolve_loaded
from dsv4bisect.config.schema import BisectSettings
from dsv4bisect.errors import BisectError, ConfigError

OFF_TEXT = ("", "0", "false", "no", "off", "none")


def _on(value: Any) -> bool:
    """A default that turns something on: a boolean switch that is true. A new number or
    string has no "off" the old release behaved as (0 is not the old behaviour of a new
    budget or split size)."""
    return value is True


def _text(value: Any) -> str:
    """A default as the command line or the environment writes it."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return str(value)


def upgrade_differences(profile: str, old: str, overrides: Overrides = Overrides()
                        ) -> tuple[str, str, list[Difference]]:
    """(new release, GPU architecture, the switches whose defaults changed or that are new and
    on by default), each at the old value (good) and the new default (bad: not stated)."""
    from dsv4bisect.patching.switch_catalog import load_catalog

    loaded = load_profile(profile, overrides)
    engine = loaded.profile.engine
    pinned = engine.vllm_version if engine.kind == "vllm" else engine.sglang_version
    if engine.kind not in ("sglang", "vllm") or not pinned:
        raise BisectError("--upgrade-from bisects an SGLang or vLLM upgrade; this profile runs "
                          "no pinned release", "pin engine.sglang_version (engine.vllm_version)"
                          " to the new release in an SGLang (vLLM) profile")
    new, arch = pinned, engine.gpu_arch or ("sm120" if engine.kind == "sglang" else "sm100")
    field = "vllm_version" if engine.kind == "vllm" else "sglang_version"
    if _key(old) >= _key(new):
        raise BisectError(f"--upgrade-from {old}: the profile runs {new}, not a newer release",
                          "give the release the deployment came from (older than the "
                          f"profile's engine.{field})")
    cat_old, cat_new = load_catalog(old, engine.kind), load_catalog(new, engine.kind)
    cfg = resolve_loaded(loaded)
    stated_env = {k for p in cfg.processes for k, _ in p.env}
    stated_args = {f for p in cfg.processes for f in argv_items(p.argv)}
    out: list[Difference] = []
    for switch in cat_new.switches:
        before = cat_old.get(switch.name)
        d_new = switch.default_for(arch)
        if before is None and switch.replaces:  # renamed (vLLM): the old value, translated
            before, d_old = _renamed(switch.name, cat_old)
        elif before is not None:
            d_old = before.default_for(arch)
        if before is not None:
            if d_old == d_new:
                continue
        elif _on(d_new):
            d_old = False  # new and on: the old release behaved as if it were off
        elif d_new not in (False, None):
            out.append(Difference((ENV if switch.kind == "env" else ARG) + switch.name,
                                  ABSENT, ABSENT, f"new in {new} with the value {d_new!r}, not "
                                  "an on/off switch: the old behaviour has no value to write"))
            continue
        else:
            continue
        env = switch.kind == "env"
        name = (ENV if env else ARG) + switch.name
        why = None
        if other_vendor(switch.name, arch, switch):
            why = other_vendor(switch.name, arch, switch)
        elif (switch.name in stated_env) if env else (switch.name in stated_args):
            why = "the profile sets it: its value did not change with the release"
        elif d_old is None:
            why = (f"{old} leaves it unset and {new} reads unset as {d_new!r}: the old "
                   "behaviour has no value to write")
        elif d_new is None and engine.kind == "vllm":
            why = (f"{new} leaves it unset (None: its code picks the behaviour), so the new "
                   "default is no value to set back from")
        elif not env and isinstance(d_old, bool) and not d_old and engine.kind != "vllm":
            why = (f"a flag {old} had off and {new} has on: the command line cannot turn a "
                   "store-true flag off")
        if not env and isinstance(d_old, bool) and engine.kind == "vllm" and "." not in name:
            # vLLM's boolean options come in pairs (BooleanOptionalAction): --x / --no-x
            name = ARG + (switch.name if d_old else "--no-" + switch.name[2:])
            good = ""
        elif not env and engine.kind == "vllm" and "." in name:
            good = json.dumps(d_old)  # a key of a JSON option: --attention-config.key VALUE
        else:
            good = ("" if d_old is True else ABSENT) if not env and isinstance(d_old, bool) \
                else _text(d_old)
        out.append(Difference(name, good, ABSENT, why))
    return new, arch, out


def upgrade_question(profile: str, old: str, overrides: Overrides = Overrides(),
                     candidates: str | None = None) -> Question:
    from dsv4bisect.bisect.switch_info import describe

    new, _, diffs = upgrade_differences(profile, old, overrides)
    chosen = [d for d in diffs if d.left_out is None]
    left = [(d.name, d.left_out or "") for d in diffs if d.left_out is not None]
    if candidates is not None:
        asked = {t.strip() for t in candidates.split(",") if t.strip()}
        left += [(d.name, "not in --candidates") for d in chosen if d.name not in asked]
        chosen = [d for d in chosen if d.name in asked]
    if not chosen:
        raise BisectError(f"no switch default that can be set back changed between {old} and "
                          f"{new}", "the regression is in code: " + code_bisect_hint(
                              profile, old, new))
    loaded = load_profile(profile, overrides)
    cfg = resolve_loaded(loaded)
    infos = {d.name: describe(d.name, d.good, loaded.profile, {}) for d in chosen}
    good, bad = ends(cfg.patch_set, chosen)
    names = tuple(d.name for d in chosen)
    return Question(
        profile, base_sets(overrides.sets), good, bad, names, tuple(left),
        {n: infos[n].risk for n in names},
        BisectSettings.model_construct(**loaded.profile.bisect.model_dump()),
        {n: f"{infos[n].delivery} (good end: {old}'s default; bad end: {new}'s)"
         for n in names},
        {n: infos[n].load_time or "" for n in names if infos[n].load_time},
        {n: f"{infos[n].tier} ({infos[n].source})" for n in names},
        {n: infos[n].weight for n in names}, upgrade=(old, new))


def _renamed(name: str, cat_old: Any) -> tuple[Any, Any]:
    """A renamed setting in the old catalog, and its old default in the new name's terms
    (vLLM: use_fp4_indexer_cache False -> indexer_kv_dtype "auto")."""
    from dsv4bisect.plugin.vllm.discover import RENAMES

    old_name, values = RENAMES.get(name, ("", {}))
    before = cat_old.get(old_name) if old_name else None
    if before is None:
        return None, None
    value = before.default_for(None)
    return before, values.get(str(value), value)


def code_bisect_hint(profile: str, old: str, new: str, kind: str | None = None) -> str:
    """How to bisect the commits between two release tags when switch defaults are cleared:
    every commit's server is probed against one baseline of the old release (a `run` of the
    profile compares two arms of the same code, so it cannot see a code regression). `kind`:
    the profile's engine kind (read from it when not given)."""
    if kind is None:
        try:
            kind = load_profile(profile).profile.engine.kind
        except ConfigError:  # a profile this process cannot read: SGLang's wording
            kind = "sglang"
    name, install = ("vLLM", "pip install -e .") if kind == "vllm" else \
        ("SGLang", "pip install -e python")
    return (f"bisect {name}'s commits v{old}..v{new}: keep a baseline of {old} (`dsv4bisect "
            f"run {profile} --set engine.{kind}_version={old}` on a {name} {old} install leaves "
            "a run directory RUN: its good end's probe, A/A repeat and null model), then in a "
            f"{name} clone `git bisect start v{new} v{old}` and `git bisect run SCRIPT`, where "
            f"SCRIPT installs the checkout ({install}), starts the server with RUN's good-end "
            "arguments and environment (RUN/baseline/config.json) and runs `dsv4bisect probe URL "
            "--baseline RUN --exit-policy git-bisect` (exit 0 good, drift alone included; 1 bad; "
            "125 skip: a commit that cannot be tested)")


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", release))
