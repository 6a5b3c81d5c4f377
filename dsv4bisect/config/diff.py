"""What differs between two resolved configurations: patches, argv flag by flag, env, settings.

Secrets (env names containing TOKEN, KEY, SECRET, PASSWORD, and the values of such flags) are
redacted before comparison, so a diff never prints them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.redact import REDACTED, is_secret, redact, redact_argv, secrets_in

ABSENT = "(absent)"


@dataclass(frozen=True)
class Change:
    section: str  # patches | process:<role> | env:<role> | probe | bisect | engine | fingerprint
    key: str
    a: Any
    b: Any


def argv_items(argv: tuple[str, ...] | list[str]) -> dict[str, str]:
    """`--flag value [value...]` pairs; leading tokens are the command; bare flags map to ''."""
    items: dict[str, str] = {}
    command: list[str] = []
    flag: str | None = None
    for token in argv:
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            flag = name
            items[flag] = value if eq else ""
        elif flag is None:
            command.append(token)
        else:
            items[flag] = f"{items[flag]} {token}".strip()
    if command:
        items = {"(command)": " ".join(command), **items}
    return items


def _patches(cfg: EngineConfig) -> dict[str, str]:
    return {p.name: p.variant + (" (fault)" if p.fault else "") for p in cfg.patches}


def _compare(section: str, a: dict[str, Any], b: dict[str, Any], absent: str = ABSENT) -> list[Change]:
    keys = list(dict.fromkeys([*a, *b]))
    return [Change(section, k, a.get(k, absent), b.get(k, absent)) for k in keys
            if a.get(k, absent) != b.get(k, absent)]


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(_flat(sub, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _env(cfg: EngineConfig, role: str) -> dict[str, str]:
    env = cfg.process(role).env_dict()
    return {k: (REDACTED if is_secret(k) else v) for k, v in env.items()}


def _engine(cfg: EngineConfig) -> dict[str, Any]:
    """The engine's own settings; `release`: the SGLang release (the embedded engine's source
    hash), which changes code as well as switch defaults."""
    version = cfg.identity.get("engine_version")
    return {"kind": cfg.kind, "release": version.get("sglang", version) if
            isinstance(version, dict) else version, "model": cfg.model,
            "served_model_name": cfg.served_model_name, "startup_timeout_s": cfg.startup_timeout_s,
            "cannot_start": cfg.cannot_start}


def diff_configs(a: EngineConfig, b: EngineConfig) -> list[Change]:
    """The changes, with every secret of either side hidden (by position and by value)."""
    secrets = secrets_in(a.to_json(redact=False)) | secrets_in(b.to_json(redact=False))
    return [Change(c.section, redact(c.key, secrets), redact(c.a, secrets), redact(c.b, secrets))
            for c in _diff(a, b)]


def _diff(a: EngineConfig, b: EngineConfig) -> list[Change]:
    changes: list[Change] = []
    engine_a, engine_b = _engine(a), _engine(b)
    changes += _compare("engine", engine_a, engine_b)
    changes += _compare("patches", _patches(a), _patches(b), absent="off")
    roles_a = [p.role for p in a.processes]
    roles_b = [p.role for p in b.processes]
    for role in dict.fromkeys([*roles_a, *roles_b]):
        if role not in roles_a or role not in roles_b:
            changes.append(Change("processes", role, role in roles_a, role in roles_b))
            continue
        changes += _compare(f"process:{role}", argv_items(redact_argv(a.process(role).argv)),
                            argv_items(redact_argv(b.process(role).argv)))
        changes += _compare(f"env:{role}", _env(a, role), _env(b, role))
    changes += _across_roles(a, b, [r for r in roles_a if r not in roles_b],
                             [r for r in roles_b if r not in roles_a])
    changes += _compare("probe", _flat(a.probe), _flat(b.probe))
    changes += _compare("bisect", _flat(a.bisect), _flat(b.bisect))
    if a.fingerprint != b.fingerprint:
        changes.append(Change("fingerprint", "fingerprint", a.fingerprint, b.fingerprint))
    return changes


def _process_items(cfg: EngineConfig, role: str) -> dict[str, Any]:
    p = cfg.process(role)
    gpus = ",".join(map(str, p.gpus)) or "-"
    own = f"{{port:{role}}}"  # its own port token names its role: not a difference
    argv = tuple(t.replace(own, "{port}") for t in redact_argv(p.argv))
    return {"(gpus)": gpus, "(port)": "auto" if p.port is None else p.port, **argv_items(argv)}


def _across_roles(a: EngineConfig, b: EngineConfig, only_a: list[str],
                  only_b: list[str]) -> list[Change]:
    """When the layouts differ (e.g. one TP server against prefill + decode + router), each
    role only A has against each role only B has, among the engine processes (those that load
    the model) and among the others: GPUs, port, argv flag by flag, env. Section
    `process:server→prefill` reads: A's server against B's prefill."""
    changes: list[Change] = []
    for engines in (True, False):
        left = [r for r in only_a if a.process(r).gets_patches is engines]
        right = [r for r in only_b if b.process(r).gets_patches is engines]
        for ra in left:
            for rb in right:
                changes += _compare(f"process:{ra}→{rb}", _process_items(a, ra),
                                    _process_items(b, rb))
                changes += _compare(f"env:{ra}→{rb}", _env(a, ra), _env(b, rb))
    return changes
