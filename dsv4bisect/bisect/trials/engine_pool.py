"""The hot runner's engine pool: the engines kept up, one per load-time state, and the switch
protocol that brings a running engine to another patch set (bisect/trials/hot_runner.py;
docs/hot-switching.md).

The pool keeps at most `size` engines, one per load-time state (`HotEngineRunner.engine_key`),
and stops the least recently used one first: which are up and which to stop is
`pricing.EngineSlots`, the class the plan's `CostTracker` prices the pool with. An engine is
launched in the patch set of the first trial that needs its state (with the hot environment, so
it can be switched later). A switch (base/switching.py): a request naming the next generation
and the patch set, `/flush_cache` on every process that runs engine code, a receipt from every
process naming the generation, and on the embedded engine the server's own report of its patch
set, all before any probe request. What goes wrong with an engine becomes the trial's verdict by
run/trial.py's `guard`, for an engine that outlives the trial (`EnginePool.guard`). An engine
found gone or unhealthy when a trial comes back to it (killed while idle, by any signal; or hung)
is dropped and relaunched, counted with its reason (`get`; docs/reliability.md, issue 40).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from dsv4bisect import env as envvars
from dsv4bisect.base import switching
from dsv4bisect.bisect.search.pricing import EngineSlots
from dsv4bisect.bisect.setting_candidates import is_setting
from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.config.processes import with_plugin
from dsv4bisect.engines.verify import server_info, verify_reference_patches
from dsv4bisect.errors import EngineError, PatchError
from dsv4bisect.patching.registry import builtin_patches
from dsv4bisect.patching.wire import format_patch_set
from dsv4bisect.probe.client import ProbeClient
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.run.arm import EngineArm, Supervisor
from dsv4bisect.run.events import EventSink, Notice
from dsv4bisect.run.trial import guard

T = TypeVar("T")
SWITCH_TIMEOUT_S = 600.0  # a CUDA-graph re-capture of an 8-GPU engine takes minutes


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
    first), and the switch protocol. `config` resolves a patch set (the switch verifies the
    embedded engine against it); `api_key` is the engines' (for `/flush_cache`)."""

    def __init__(self, size: int, *, config: Callable[[Mapping[str, str]], EngineConfig],
                 api_key: str | None, supervisor: Supervisor, on_event: EventSink) -> None:
        self.slots: EngineSlots[str] = EngineSlots(size)
        self.engines: dict[str, HotEngine] = {}
        self.config, self.api_key = config, api_key
        self.supervisor, self.on_event = supervisor, on_event
        self.launches = 0  # engines launched (a crash relaunch counts once more)
        self._relaunches: list[str] = []  # why kept-up engines were dropped, not yet reported

    @property
    def up(self) -> tuple[str, ...]:
        """The load-time states whose engine is up."""
        return tuple(self.slots.up)

    def get(self, key: str) -> HotEngine | None:
        """The engine of `key` if it is up and healthy (now the most recently used). One that
        is gone or fails its health check while kept up (killed idle, crashed, hung) leaves
        the pool, and the relaunch is counted with its reason (`take_relaunches`): the caller
        launches a fresh one, whose trial is then a fresh launch's. It is never the verdict of
        the trial that finds it: that trial measured nothing in it."""
        if not self.slots.use(key):
            return None
        eng = self.engines[key]
        why = eng.arm.launch.health() if eng.arm.launch is not None else None
        if why is None:  # (no launch: the arm launches on `ready()`)
            return eng
        self.drop(eng)
        self._relaunches.append(why)
        self.on_event(Notice(f"the engine kept up for the next trial cannot serve ({why}): "
                             "relaunching it", "warn"))
        return None

    def take_relaunches(self) -> list[str]:
        """Why each engine found dead or unhealthy since the last call was relaunched (a trial
        reports them in its details, `relaunched`)."""
        out, self._relaunches = self._relaunches, []
        return out

    def add(self, key: str, eng: HotEngine) -> None:
        self.slots.add(key)
        self.engines[key] = eng

    def new(self, name: str, patches: Mapping[str, str], cfg: EngineConfig,
            eng_dir: Path) -> HotEngine:
        """An engine for `patches` launched as `cfg` (with the hot environment, or none for a
        fresh confirmation), room made for it first; its arm starts it on `ready()`."""
        for key in self.slots.make_room():  # the least recently used engines stop first
            self.engines.pop(key).arm.stop()
        self.launches += 1
        arm = EngineArm(name, cfg, eng_dir, self.supervisor, self.on_event)
        return HotEngine(patches, cfg, arm, eng_dir / "switch")

    def drop(self, eng: HotEngine) -> None:
        eng.arm.stop()
        for key in [k for k, e in self.engines.items() if e is eng]:
            self.slots.remove(key)
            del self.engines[key]

    def close(self) -> None:
        for eng in list(self.engines.values()):
            self.drop(eng)

    def switch(self, eng: HotEngine, patches: Mapping[str, str]) -> float:
        """Bring the running engine to `patches` (after a crash relaunch: from its base);
        the seconds it took (0: it was there)."""
        launch = eng.arm.launch
        if launch is not eng.launch:  # relaunched: the process starts from the base state
            eng.launch, eng.current = launch, dict(eng.base)
        if eng.current == dict(patches):
            return 0.0
        t = time.perf_counter()
        eng.generation += 1
        # settings (bisect/setting_candidates.py) are load-time: the engine's base holds them
        switching.write_request(eng.dir, eng.generation, format_patch_set(
            {n: v for n, v in patches.items() if not is_setting(n)}, builtin_patches()))
        assert launch is not None
        for proc in launch.procs:  # type: ignore[attr-defined]
            if proc.spec.gets_patches:
                client = ProbeClient(proc.url, api_key=self.api_key, timeout_s=60, retries=1)
                try:
                    client.flush_cache()
                finally:
                    client.close()
        switching.wait_receipts(eng.dir, eng.generation, switching.expected_receipts(eng.cfg),
                                SWITCH_TIMEOUT_S)
        if eng.cfg.kind == "reference":  # the engine must now report exactly the new set
            verify_reference_patches(self.config(patches), server_info(launch.url))
        eng.current = dict(patches)
        eng.switches += 1
        return time.perf_counter() - t

    def guard(self, spec: ProbeSpec, eng: HotEngine, work: Callable[[], T], *,
              good_end: bool = False) -> T:
        """run/trial.py's guard, for an engine that outlives the trial (`spec`: the trial's,
        for the verdict that stops it): one that crashed or cannot serve leaves the pool; a
        candidate's crash is decided here (no cached-baseline or relaunch note: the good end
        is measured once per seed block); a PatchError (a switch that did not take) is the
        engine's fault; an EngineError gets the log tail (a switch's or a receipt's error does
        not carry it, unlike a launch's)."""
        return guard(spec, eng.arm, work, good_end=good_end,
                     crash_note="the good end ran without crashing",
                     lost=lambda: self.drop(eng), broken=(EngineError, PatchError),
                     engine_tail=True)


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
