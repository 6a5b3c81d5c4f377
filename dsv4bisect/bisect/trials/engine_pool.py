"""The hot runner's engines (bisect/trials/hot_runner.py): one launched engine and the pool of
those kept up at once, and how a hot launch's configuration is made.

The pool keeps at most `size` engines, one per load-time state (`HotEngineRunner.engine_key`),
and stops the least recently used one first: which are up and which to stop is
`pricing.EngineSlots`, the class the plan's `CostTracker` prices the pool with
(docs/hot-switching.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsv4bisect import env as envvars
from dsv4bisect.bisect.search.pricing import EngineSlots
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.config.processes import with_plugin
from dsv4bisect.run.arm import EngineArm


class HotEngine:
    """One launched engine: the patch set it was launched in (`base`) and the one it is
    switched to now (`current`)."""

    def __init__(self, base: Mapping[str, str], cfg: EngineConfig, arm: EngineArm,
                 switch_dir: Path) -> None:
        self.base, self.cfg, self.arm, self.dir = dict(base), cfg, arm, switch_dir
        self.generation = 0
        self.current: dict[str, str] = dict(base)
        self.launch: object | None = None  # the Launch `current` refers to
        self.switches = 0  # switches since this engine's first launch

    def fresh_in(self, patches: Mapping[str, str]) -> bool:
        """What it measured for `patches` is a fresh launch of `patches`: launched in
        `patches`, never switched, never relaunched."""
        return self.switches == 0 and self.arm.attempts <= 1 and self.base == dict(patches)


class EnginePool:
    """The engines kept up, by load-time state (`slots`: which are up, least recently used
    first)."""

    def __init__(self, size: int) -> None:
        self.slots: EngineSlots[str] = EngineSlots(size)
        self.engines: dict[str, HotEngine] = {}

    def get(self, key: str) -> HotEngine | None:
        """The engine of `key` if it is up (now the most recently used)."""
        return self.engines[key] if self.slots.use(key) else None

    def add(self, key: str, eng: HotEngine) -> None:
        self.slots.add(key)
        self.engines[key] = eng

    def make_room(self) -> None:
        """Stop the least recently used engines until one more fits."""
        for key in self.slots.make_room():
            self.engines.pop(key).arm.stop()

    def drop(self, eng: HotEngine) -> None:
        eng.arm.stop()
        for key in [k for k, e in self.engines.items() if e is eng]:
            self.slots.remove(key)
            del self.engines[key]

    def close(self) -> None:
        for eng in list(self.engines.values()):
            self.drop(eng)


def new_dir(parent: Path, stem: str) -> Path:
    """A directory no launch used before (a resumed bisect must not read a killed one's
    switch requests and receipts)."""
    n = 0
    while (parent / f"{stem}-{n}").exists():
        n += 1
    path = parent / f"{stem}-{n}"
    path.mkdir(parents=True)
    return path


def with_env(cfg: EngineConfig, extra: Mapping[str, str]) -> EngineConfig:
    """`cfg` with `extra` in the environment of every process that runs engine code (and, on
    SGLang, the plugin loaded: a base launched with no patch on must still install the switch)."""
    def env_of(p: Any) -> tuple[tuple[str, str], ...]:
        env = {**p.env_dict(), **extra}
        if cfg.kind == "sglang":
            env[envvars.SGLANG_PLUGINS] = with_plugin(env.get(envvars.SGLANG_PLUGINS, ""))
        return tuple(sorted(env.items()))

    procs = tuple(dataclasses.replace(p, env=env_of(p)) if p.gets_patches else p
                  for p in cfg.processes)
    return dataclasses.replace(cfg, processes=procs)
