"""The embedded engine's switches, discovered from its own launcher (release "embedded").

SGLang's switches are read from a release's source; the embedded engine's are read from how
this package launches it: every profile key of `engine` and `engine.reference` is changed in
turn on the `reference` profile and resolved, and the keys that change the server's argv or
env are its switches (the flag or variable they reach is `gates`). Keys that reach nothing
(`tp`, `sglang_version`: SGLang's) are not switches of this engine; keys that reach only the
address, port or API name are listed in `CANNOT_MATTER`. The patches are switches too: hooks,
hot (switched in a running engine through its switch file, docs/hot-switching.md).

Tier (the bisect's prior, docs/bisect.md "Bisecting two configurations") is the one judgement
here, by what a key selects: a kernel, a precision, the scheduling of batches, the topology.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from functools import cache
from typing import Any

from dsv4bisect.config.schema import Engine, ReferenceSettings

RELEASE = "embedded"
TIERS = ("kernel", "precision", "topology", "scheduling", "logging", "other")
# What each embedded setting selects (the prior's tier); a key not named here is `other`.
TIER_OF = {"moe_backend": "kernel", "reference.device": "kernel",
           "precision": "precision", "reference.checkpoint": "precision",
           "chunked_prefill_size": "scheduling", "max_running_requests": "scheduling",
           "disable_radix_cache": "scheduling", "reference.max_model_len": "scheduling",
           "gpus": "topology"}
# Keys whose flags never change a computation: where the server listens and what it is called.
CANNOT_MATTER = {"host": "the address the server binds", "port": "a port",
                 "served_model_name": "the model's name in the API",
                 "startup_timeout_s": "how long the launcher waits for readiness",
                 "api_key_env": "the API key's variable name"}


@dataclass(frozen=True)
class EmbeddedSwitch:
    """One switch, in the catalog's schema (name, kind, type, default, read, hot, gates,
    where, tier); `name` is the profile key (`engine.…`) or the patch."""

    name: str
    kind: str  # arg (a `dsv4bisect serve` flag) | env | hook (a patch)
    type: str
    default: Any
    read: str  # construction (at launch) | call (every call: a hot patch)
    hot: bool
    gates: str
    where: str
    tier: str


def _perturbed(field: str, annotation: Any, default: Any) -> Any | None:
    """A value other than `default` that the schema accepts, or None when there is none to try
    (sections and free-form maps are compared key by key by the bisect, not here)."""
    base = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if annotation is bool:
        return not default
    literal = [a for a in args if typing.get_origin(a) is typing.Literal] or (
        [annotation] if base is typing.Literal else [])
    for lit in literal:
        others = [v for v in typing.get_args(lit) if v != default and v != "auto"]
        if others:
            return others[0]
    names = repr(annotation)
    if "int" in names and "list" not in names:
        return (default or 64) + 1
    if "list[" in names:
        return [1]
    if annotation is str or names.startswith("str"):
        return f"{default or field}-other"
    return None


def _reach(cfg: Any) -> dict[str, str]:
    proc = cfg.process("server")
    from dsv4bisect.config.diff import argv_items  # sibling module; loads nothing else

    return {**argv_items(proc.argv), **{f"env {k}": v for k, v in proc.env}}


@cache
def embedded_catalog() -> tuple[EmbeddedSwitch, ...]:
    """Every switch of the embedded engine (profile keys, then the patches)."""
    from dsv4bisect.config.resolve import Overrides, resolve
    from dsv4bisect.errors import Dsv4BisectError
    from dsv4bisect.patching.registry import builtin_patches

    from dsv4bisect.config.resolve import load_profile

    base = _reach(resolve("reference"))
    current = load_profile("reference").profile.engine.model_dump()
    current.update({f"reference.{k}": v for k, v in (current.get("reference") or {}).items()})
    out: list[EmbeddedSwitch] = []
    fields = [(k, f) for k, f in Engine.model_fields.items()
              if k not in ("kind", "env", "args", "pd", "command", "reference")]
    fields += [(f"reference.{k}", f) for k, f in ReferenceSettings.model_fields.items()]
    for key, info in fields:
        if key in CANNOT_MATTER:
            continue
        value = _perturbed(key, info.annotation, current.get(key, info.default))
        if value is None:
            continue
        try:
            changed = _reach(resolve("reference", Overrides(sets=(f"engine.{key}={value!r}"
                                                                  .replace("'", '"'),))))
        except Dsv4BisectError:
            continue  # a value this engine refuses: not a switch we can move here
        gates = sorted(k for k in {*base, *changed} if base.get(k) != changed.get(k))
        if not gates:
            continue  # the launcher does not pass it to the embedded engine
        out.append(EmbeddedSwitch(
            f"engine.{key}", "env" if all(g.startswith("env ") for g in gates) else "arg",
            _type_name(info.annotation), info.default, "construction", False,
            ", ".join(gates), "config/processes.py (_reference)", TIER_OF.get(key, "other")))
    for patch in builtin_patches().values():
        out.append(EmbeddedSwitch(
            patch.name, "hook", "variant: " + "|".join(v.name for v in patch.variants),
            "off", "call", True, patch.summary, f"patches/{patch.name.replace('-', '_')}.py",
            "kernel"))  # every patch swaps a kernel; its risk tier weighs it (question.py)
    return tuple(out)


def embedded_switch(name: str) -> EmbeddedSwitch | None:
    return next((s for s in embedded_catalog() if s.name == name), None)


def _type_name(annotation: Any) -> str:
    text = repr(annotation).replace("typing.", "")
    return "bool" if annotation is bool else "int" if "int" in text and "list" not in text \
        else "list" if "list[" in text else "str"
