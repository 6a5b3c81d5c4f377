"""The resolved, frozen engine configuration: exactly what will be started, and its fingerprint.

Argv lists keep symbolic tokens for what varies between runs of the same experiment:
`{port:<role>}` (ports chosen at launch when `auto`), `{python}` (the interpreter running
dsv4bisect), `{model}` (the model path, identified by content in the fingerprint) and
`{worktree}` (the cached git worktree of source patches). `materialize()` substitutes them.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from dsv4bisect.redact import REDACTED, redact_argv  # noqa: F401 - re-exported for callers
from dsv4bisect.redact import redact as redact_data

TOKEN = re.compile(r"\{(port:[a-z]+|python|model|worktree)\}")


@dataclass(frozen=True)
class ProcessSpec:
    role: str  # server | prefill | decode | router
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # sorted (name, value)
    gpus: tuple[int, ...]
    port: int | None  # None: chosen free at launch
    ready_path: str  # GET path that answers 200 when ready
    gets_patches: bool  # runs engine code that installs patches (writes receipts)
    schedulers: int  # scheduler processes behind it (TP × DP), each writes receipts

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


@dataclass(frozen=True)
class PatchChoice:
    name: str
    variant: str
    fault: bool
    builtin: bool
    tier: int
    summary: str
    inert: str | None = None  # reason, when the patch cannot change anything here
    required: str | None = None  # reason, when the engine cannot start without it
    # False: inert by an SGLang release rule or masked by another patch, so never sent to the
    # engine (no hook, no receipt); `delivery` says how "on" reaches the engine
    delivered: bool = True
    delivery: str = ""  # hook | env VAR=V | upstream | absent | masked by P | reference
    load_time: str | None = None  # why switching it needs a fresh launch; None: hot-switchable


@dataclass(frozen=True)
class EngineConfig:
    profile: str
    kind: str
    host: str
    entry_role: str  # the process the probe talks to
    processes: tuple[ProcessSpec, ...]
    patches: tuple[PatchChoice, ...]  # enabled, registry order then custom
    available: tuple[PatchChoice, ...]  # every patch this profile could enable (default variant)
    model: str | None
    served_model_name: str | None
    api_key_env: str | None
    startup_timeout_s: float
    probe: dict[str, Any]
    bisect: dict[str, Any]
    cannot_start: str | None  # why this configuration would not start (a required patch is off)
    worktree: str | None  # source-patch worktree path, when any source patch is enabled
    identity: dict[str, Any] = field(default_factory=dict)  # what the fingerprint covers
    fingerprint: str = ""
    provenance: dict[str, str] = field(default_factory=dict)  # dotted key -> where it was set

    @property
    def patch_set(self) -> dict[str, str]:
        return {p.name: p.variant for p in self.patches}

    def process(self, role: str) -> ProcessSpec:
        return next(p for p in self.processes if p.role == role)

    def port_names(self) -> set[str]:
        """Every `{port:NAME}` the processes name: their roles', and ports that are not a
        process's own (a PD prefill server's `{port:bootstrap}`)."""
        return {m.group(1)[len("port:"):] for p in self.processes
                for text in (*p.argv, *(v for _, v in p.env))
                for m in TOKEN.finditer(text) if m.group(1).startswith("port:")}

    def materialize(self, ports: dict[str, int], python: str) -> list[ProcessSpec]:
        """Processes with every token substituted (ports by role, the interpreter, paths)."""
        values = {f"port:{role}": str(port) for role, port in ports.items()}
        values.update(python=python, model=self.model or "", worktree=self.worktree or "")

        def sub(text: str) -> str:
            return TOKEN.sub(lambda m: values.get(m.group(1), m.group(0)), text)

        return [
            ProcessSpec(
                role=p.role,
                argv=tuple(sub(a) for a in p.argv),
                env=tuple((k, sub(v)) for k, v in p.env),
                gpus=p.gpus,
                port=ports.get(p.role, p.port),
                ready_path=p.ready_path,
                gets_patches=p.gets_patches,
                schedulers=p.schedulers,
            )
            for p in self.processes
        ]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EngineConfig:
        """Rebuild from `to_json(redact=False)` output (e.g. a run directory's config.json)."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["processes"] = tuple(
            ProcessSpec(**{**p, "argv": tuple(p["argv"]), "env": tuple(sorted(p["env"].items())),
                           "gpus": tuple(p["gpus"])})
            for p in data["processes"]
        )
        fields["patches"] = tuple(PatchChoice(**p) for p in data["patches"])
        fields["available"] = tuple(PatchChoice(**p) for p in data["available"])
        return cls(**fields)

    def to_json(self, *, redact: bool = True) -> dict[str, Any]:
        """The config as JSON; `redact` hides secrets everywhere in it (processes, identity,
        provenance, custom patches), not only in the process list."""
        out = asdict(self)
        out["patch_set"] = self.patch_set
        for proc in out["processes"]:
            proc["env"] = dict(proc["env"])
            proc["argv"] = list(proc["argv"])
        return redact_data(out) if redact else out
