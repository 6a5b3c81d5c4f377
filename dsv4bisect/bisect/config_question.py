"""The question of `bisect --good-config A --bad-config B`: every difference is a candidate.

A and B are profiles (files or built-in names) or run directories (their recorded profile and
overrides). Trials run A's profile with a subset of the differences at B's values
(bisect/setting_candidates.py names them): the patches, each `engine` key, each variable of
`engine.env`, each server flag of `engine.args`. A difference that cannot change a computation
(ports, addresses, timeouts, names, log settings, secrets) is left out with its reason, and so
are the probe and bisect sections (A's probe judges every trial). Two SGLang releases are not
a difference to bisect here: `--upgrade-from` is (bisect/upgrade.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4bisect.bisect.question import Question, base_sets
from dsv4bisect.bisect.search.hypotheses import MAX_CANDIDATES
from dsv4bisect.bisect.switch_info import catalog_switch, describe, in_catalog, other_vendor
from dsv4bisect.bisect.setting_candidates import ABSENT, ARG, ENV, is_setting, key_value
from dsv4bisect.config.diff import argv_items
from dsv4bisect.config.resolve import LoadedProfile, Overrides, load_profile, resolve
from dsv4bisect.config.schema import BisectSettings
from dsv4bisect.errors import BisectError, ConfigError
from dsv4bisect.redact import is_secret

# Keys of `engine` that never change a computation, with the reason shown (as the fingerprint
# leaves ports and paths out). `model` is compared by content below, not by path.
CANNOT_MATTER = {
    "host": "the address the server binds", "port": "a port", "python": "the interpreter's "
    "path (the fingerprint leaves it out)", "served_model_name": "the model's name in the API",
    "api_key_env": "the API key's variable name", "startup_timeout_s": "how long the launcher "
    "waits", "allow_unverified_sglang": "a guard of the launcher, not of the engine",
    "allow_unverified_vllm": "a guard of the launcher, not of the engine"}
QUIET_FLAG = re.compile(r"^--(port|host|.*log.*|api-key|served-model-name|download-dir|"
                        r"enable-metrics|show-time-cost|.*bootstrap-port.*)$")
# Variables that only say where to log, listen or keep files (a switch of the engine's catalog
# is never one of them: it is read on the model's path).
QUIET_ENV = re.compile(r"(^|_)(LOG|LOGGING|LOG_LEVEL|VERBOSITY)(_|$)|(_PORT|_HOME|_DIR|_PATH)$|"
                       r"^(HOME|PATH|TMPDIR)$")
@dataclass(frozen=True)
class Difference:
    name: str  # the candidate's name (a patch, engine.K, env:X, arg:--F)
    good: str  # its value at A (ABSENT: not stated)
    bad: str
    left_out: str | None = None  # why it cannot matter


def load_end(ref: str, overrides: Overrides = Overrides()) -> tuple[str, LoadedProfile,
                                                                   tuple[str, ...]]:
    """(profile ref, loaded profile, its --set items) of a profile or a run directory."""
    path = Path(ref)
    if path.is_dir():
        from dsv4bisect.base.bounded import load_json

        run = path / "run.json"
        if not run.is_file():
            raise ConfigError(f"{ref} is a directory without run.json",
                              "give a run directory written by `dsv4bisect run`, or a profile")
        doc = load_json(run, "run")
        recorded = doc.get("overrides") or {}
        ov = Overrides(sets=tuple(recorded.get("sets") or ()),
                       enable=tuple(recorded.get("enable") or ()),
                       disable=tuple(recorded.get("disable") or ()),
                       only=None if recorded.get("only") is None else tuple(recorded["only"]))
        if any("REDACTED" in s or "…" in s for s in ov.sets):
            raise ConfigError(f"{ref}: its run.json keeps a secret --set redacted",
                              "give the profile and the --set items instead")
        return str(doc["profile"]), load_profile(str(doc["profile"]), ov), base_sets(ov.sets)
    return ref, load_profile(ref, overrides), base_sets(overrides.sets)


def differences(a: LoadedProfile, b: LoadedProfile, a_ref: str, b_ref: str
                ) -> list[Difference]:
    """Every difference between the two configurations, in profile order."""
    ea, eb = a.profile.engine, b.profile.engine
    if ea.kind != eb.kind:
        raise BisectError(f"A is a `{ea.kind}` engine and B a `{eb.kind}` one",
                          "bisect two configurations of one engine kind")
    if ea.kind == "sglang" and (ea.sglang_version or "") != (eb.sglang_version or ""):
        raise BisectError(
            f"A runs SGLang {ea.sglang_version} and B SGLang {eb.sglang_version}: a release "
            "changes code as well as switches",
            f"bisect the upgrade: dsv4bisect bisect {b_ref} --upgrade-from {ea.sglang_version} "
            "(the switches whose defaults changed; it says when the code is to blame)")
    if ea.kind == "vllm" and (ea.vllm_version or "") != (eb.vllm_version or ""):
        raise BisectError(
            f"A runs vLLM {ea.vllm_version} and B vLLM {eb.vllm_version}: a release changes "
            "code as well as switches", f"bisect the upgrade: dsv4bisect bisect {b_ref} "
            f"--upgrade-from {ea.vllm_version}")
    out = _patch_differences(a_ref, b_ref, a, b)
    da, db = ea.model_dump(), eb.model_dump()
    for key in dict.fromkeys([*da, *db]):
        if key in ("env", "args", "kind"):
            continue
        for sub, va, vb in _leaves(key, da.get(key), db.get(key)):
            if va != vb:
                out.append(Difference(f"engine.{sub}", _value(va), _value(vb),
                                      _key_left_out(sub, a_ref, b_ref)))
    for name in dict.fromkeys([*ea.env, *eb.env]):
        va, vb = ea.env.get(name, ABSENT), eb.env.get(name, ABSENT)
        if va != vb:
            listed = in_catalog(name, a.profile)  # read on V4's path: never quiet or secret
            why = ("a secret" if is_secret(name) and not listed else "a log, port or path "
                   "setting" if QUIET_ENV.search(name) and not listed else
                   other_vendor(name, ea.gpu_arch or "sm120", catalog_switch(name, a.profile))
                   if ea.kind in ("sglang", "vllm") else None)
            out.append(Difference(f"{ENV}{name}", va, vb, why))
    fa, fb = argv_items(tuple(ea.args)), argv_items(tuple(eb.args))
    for flag in dict.fromkeys([*fa, *fb]):
        va, vb = fa.get(flag, ABSENT), fb.get(flag, ABSENT)
        if va != vb:
            quiet = (QUIET_FLAG.match(flag) and not in_catalog(flag, a.profile)) or \
                flag == "(command)"
            out.append(Difference(f"{ARG}{flag}", va, vb,
                                  "a log, port, address or name flag" if quiet else None))
    for section in ("probe", "bisect"):
        if getattr(a.profile, section) != getattr(b.profile, section):
            out.append(Difference(section, "A's", "B's", f"the {section} settings: A's judge "
                                  "every trial (they are the test, not the configuration)"))
    return out


def _patch_differences(a_ref: str, b_ref: str, a: LoadedProfile, b: LoadedProfile
                       ) -> list[Difference]:
    from dsv4bisect.config.resolve import resolve_loaded

    ca, cb = resolve_loaded(a), resolve_loaded(b)
    pa, pb = ca.patch_set, cb.patch_set
    out = []
    for name in dict.fromkeys([*(p.name for p in cb.available), *pa, *pb]):
        if pa.get(name) == pb.get(name):
            continue
        why = None
        if name not in {p.name for p in ca.available}:
            why = f"a custom patch only B defines: add its definition to {a_ref}"
        out.append(Difference(name, pa.get(name, ABSENT), pb.get(name, ABSENT), why))
    return out


def _leaves(key: str, a: Any, b: Any) -> list[tuple[str, Any, Any]]:
    """Dotted leaves of two values (sections recurse; lists and scalars are leaves)."""
    if isinstance(a, dict) or isinstance(b, dict):
        da, db = a if isinstance(a, dict) else {}, b if isinstance(b, dict) else {}
        if not (isinstance(a, dict) and isinstance(b, dict)):
            return [(key, a, b)]  # a whole section on one side only (engine.pd)
        return [leaf for k in dict.fromkeys([*da, *db])
                for leaf in _leaves(f"{key}.{k}", da.get(k, ABSENT), db.get(k, ABSENT))]
    return [(key, a, b)]


def _value(value: Any) -> str:
    return ABSENT if value == ABSENT else key_value(value)


def _key_left_out(key: str, a_ref: str, b_ref: str) -> str | None:
    last = key.rsplit(".", 1)[-1]
    if key in CANNOT_MATTER:
        return CANNOT_MATTER[key]
    if last in ("port", "bootstrap_port"):
        return "a port"
    if key == "model":
        ma = resolve(a_ref).identity.get("model")
        mb = resolve(b_ref).identity.get("model")
        if ma == mb and ma not in (None, "unavailable-here"):
            return "the same checkpoint at another path (identified by content)"
    return None


def config_question(good_ref: str, bad_ref: str, overrides: Overrides = Overrides(),
                    candidates: str | None = None) -> Question:
    """The question between two configurations; `overrides` apply to B (as diff-config)."""
    from dsv4bisect.config.resolve import resolve_loaded

    a_ref, a, a_sets = load_end(good_ref)
    b_ref, b, _ = load_end(bad_ref, overrides)
    diffs = differences(a, b, a_ref, b_ref)
    chosen = [d for d in diffs if d.left_out is None]
    left = [(d.name, d.left_out or "") for d in diffs if d.left_out is not None]
    if candidates is not None:
        asked = [t.strip() for t in candidates.split(",") if t.strip()]
        unknown = [n for n in asked if n not in {d.name for d in chosen}]
        if unknown or not asked:
            raise BisectError(f"--candidates: `{(unknown or [''])[0]}` is not a difference "
                              "that can be searched", "candidates: " +
                              ", ".join(d.name for d in chosen))
        left += [(d.name, "not in --candidates") for d in chosen if d.name not in asked]
        chosen = [d for d in chosen if d.name in asked]
    if not chosen:
        raise BisectError("A and B do not differ in anything that can change a computation",
                          "; ".join(f"{n}: {why}" for n, why in left) or "they are identical")
    resolved_a, resolved_b = resolve(a_ref, Overrides(sets=a_sets)), resolve_loaded(b)
    choices = {p.name: p for p in (*resolved_a.patches, *resolved_b.patches)}
    infos = {d.name: describe(d.name, d.bad if d.bad != ABSENT else d.good, b.profile,
                              choices) for d in chosen}
    if candidates is None:
        left += [(d.name, f"inert: {infos[d.name].inert}") for d in chosen
                 if infos[d.name].inert]
        chosen = [d for d in chosen if not infos[d.name].inert]
        if not chosen:
            raise BisectError("every difference between A and B is inert or cannot matter",
                              "; ".join(f"{n}: {why}" for n, why in left))
    if len(chosen) > MAX_CANDIDATES:
        raise _too_many(chosen, infos, a_ref, b_ref)
    good, bad = ends(resolved_a.patch_set, chosen)
    names = tuple(d.name for d in chosen)
    return Question(
        a_ref, a_sets, good, bad, names, tuple(left), {n: infos[n].risk for n in names},
        BisectSettings.model_construct(**a.profile.bisect.model_dump()),
        {n: infos[n].delivery for n in names},
        {n: infos[n].load_time or "" for n in names if infos[n].load_time},
        {n: f"{infos[n].tier} ({infos[n].source})" for n in names},
        {n: infos[n].weight for n in names if is_setting(n)})


def _too_many(chosen: list[Difference], infos: dict[str, Any], a_ref: str, b_ref: str
              ) -> BisectError:
    """The refusal of more candidates than one search weighs, with the first round to run:
    the MAX_CANDIDATES of the highest prior weight (kernel and precision switches first, then
    profile order)."""
    ranked = sorted(range(len(chosen)), key=lambda i: (-infos[chosen[i].name].weight, i))
    first = [chosen[i].name for i in sorted(ranked[:MAX_CANDIDATES])]
    return BisectError(
        f"A and B differ in {len(chosen)} settings that can change a computation; one bisect "
        f"searches at most {MAX_CANDIDATES} (its culprit sets grow with the square)",
        f"bisect them in rounds of {MAX_CANDIDATES}, the likeliest first: dsv4bisect bisect "
        f"--good-config {a_ref} --bad-config {b_ref} --candidates {','.join(first)}; if it "
        f"ends BAD-END-PASSES the culprit is among the other {len(chosen) - len(first)} "
        f"(`dsv4bisect diff-config {a_ref} {b_ref}` lists every difference)")


def ends(a_patches: dict[str, str], chosen: list[Difference]
         ) -> tuple[dict[str, str], dict[str, str]]:
    """The two ends as the search names them: A's patches and the chosen differences at A's
    values, and the same with B's. A patch off at an end is absent from its map; a setting
    not stated at an end is there as ABSENT (switching it removes the key or flag)."""
    good, bad = dict(a_patches), dict(a_patches)
    for d in chosen:
        setting = is_setting(d.name)
        for end, value in ((good, d.good), (bad, d.bad)):
            if value != ABSENT or setting:
                end[d.name] = value
            else:
                end.pop(d.name, None)
    return good, bad
