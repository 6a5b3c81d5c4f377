"""The hot-switch protocol between the driver and a running engine (docs/hot-switching.md).

Driver side: drain (no request in flight), `write_request(dir, g, wire)`, POST `/flush_cache`
to every server, `wait_receipts(dir, g, expected_receipts(cfg))`; no probe request is sent
before every receipt is in. Engine side (the embedded engine's server, the SGLang plugin in
every scheduler process): at `/flush_cache`, a request whose generation is newer than the one
applied is applied, then `write_receipt(...)` names the generation, and the prefix cache is
flushed. Files are written atomically (a reader never sees half a file). No torch, no SGLang.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dsv4bisect.base.atomic import write_json
from dsv4bisect.errors import EngineError

REQUEST = "request.json"
POLL_S = 0.05


@dataclass(frozen=True)
class SwitchRequest:
    generation: int
    patches: str  # wire format (patching/wire.py): the whole new patch set


def _atomic_write(path: Path, data: Mapping[str, Any]) -> None:
    write_json(path, data, indent=None, sort_keys=True)


def write_request(switch_dir: Path, generation: int, wire: str) -> None:
    switch_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write(switch_dir / REQUEST, {"generation": generation, "patches": wire})


def read_request(switch_dir: Path) -> SwitchRequest | None:
    """The pending request, or None when there is none (or it cannot be read yet)."""
    try:
        data = json.loads((switch_dir / REQUEST).read_text())
        return SwitchRequest(int(data["generation"]), str(data["patches"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def receipt_name(generation: int, role: str, tp_rank: int) -> str:
    return f"receipt-g{generation}-{role}-tp{tp_rank}.json"


def write_receipt(switch_dir: Path, generation: int, role: str, tp_rank: int, *, ok: bool,
                  patches: str, error: str | None = None, graphs: str = "none",
                  env: Mapping[str, str] | None = None, dp_rank: int | None = None,
                  copies: Mapping[str, str] | None = None) -> Path:
    """`env`: the switch variables as set; `copies`: the module globals a release copied a
    switch into at import, as its code now reads them (repr)."""
    path = switch_dir / receipt_name(generation, role, tp_rank)
    _atomic_write(path, {"generation": generation, "role": role, "tp_rank": tp_rank,
                         "dp_rank": dp_rank, "pid": os.getpid(), "patches": patches,
                         "env": dict(env or {}), "copies": dict(copies or {}),
                         "graphs": graphs, "ok": ok, "error": error})
    return path


class _Process(Protocol):  # what this reads of config.engine_config.ProcessSpec
    role: str
    gets_patches: bool
    schedulers: int


class _Config(Protocol):  # ... and of an EngineConfig (the foundation imports no config/)
    @property
    def processes(self) -> Sequence[_Process]: ...


def expected_receipts(cfg: _Config) -> set[tuple[str, int]]:
    """(role, tp_rank) of every process that must apply a switch: each scheduler of each
    process that runs engine code (the router runs none)."""
    return {(p.role, rank) for p in cfg.processes if p.gets_patches
            for rank in range(max(1, p.schedulers))}


def wait_receipts(switch_dir: Path, generation: int, expected: Iterable[tuple[str, int]],
                  timeout_s: float) -> list[dict[str, Any]]:
    """Every expected receipt of `generation`; EngineError on a refusal or on timeout."""
    want = set(expected)
    deadline = time.monotonic() + timeout_s
    while True:
        found: dict[tuple[str, int], dict[str, Any]] = {}
        for role, rank in want:
            try:
                found[(role, rank)] = json.loads(
                    (switch_dir / receipt_name(generation, role, rank)).read_text())
            except (OSError, ValueError):
                continue
        refused = [r for r in found.values() if not r.get("ok")]
        if refused:
            r = refused[0]
            raise EngineError(f"switch {generation} refused by {r.get('role')} tp{r.get('tp_rank')}"
                              f": {r.get('error')}", "relaunch this configuration fresh "
                              "(--fresh-launches)")
        if len(found) == len(want):
            return [found[k] for k in sorted(found)]
        if time.monotonic() > deadline:
            missing = ", ".join(f"{role} tp{rank}" for role, rank in sorted(want - set(found)))
            have = ", ".join(f"{role} tp{rank}" for role, rank in sorted(found)) or "none"
            raise EngineError(f"switch {generation}: no receipt from {missing} within "
                              f"{timeout_s:.0f} s (answered: {have})", "see the engine logs; "
                              "a process that did not apply the switch must not be probed")
        time.sleep(POLL_S)
