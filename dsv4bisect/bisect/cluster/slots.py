"""The Ray runner's pool of node slots: its engine pool at the scale of a cluster.

A slot is an actor placed on a node (bisect/cluster/ray_executor.py `TrialActor`), kept across
trials with the node runner it built and what the driver knows of it: the ends it measured or
was sent, the load-time states whose engine is up there after its last trial. A trial takes the
free slot whose engine is up in its load-time state (a hot switch there, not a launch), else
the slot free longest; the round's idle slots serve the ends' probes as replicas.

Faults: Ray never re-runs anything (`max_restarts=0`, `max_task_retries=0`); a slot whose actor
died is forgotten and a replacement asked for in the background (placed when a node has room).
The first slot must be placed and pass its node's preflight within `PLACE_TIMEOUT_S` (a node's
error is raised here, before the bisect writes anything); the others join as nodes have room.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

from dsv4bisect.bisect.cluster import remote_trial as rt
from dsv4bisect.errors import BisectError, Dsv4BisectError

PLACE_TIMEOUT_S = 120.0  # for the first slot to be placed and pass its node's preflight
OTHERS_GRACE_S = 20.0  # then for the other slots, before trials start on those placed
STOP_TIMEOUT_S = 60.0  # for the actors to stop their engines on Ctrl-C


class Slot:
    """A placed actor, and what the driver knows its runner has."""

    def __init__(self, actor: Any, node: str, ip: str | None = None) -> None:
        self.actor, self.node, self.ip = actor, node, ip
        self.ends: frozenset[str] = frozenset()  # ends it measured or was sent (b<n>/<end>)
        self.engines: tuple[str, ...] = ()  # load-time states up after its last trial


class SlotPool:
    """The node slots of one bisect. `ask` places one more actor (its handle and the ref of
    its `ready()`); `wants`: what a slot asks of a node, for the error when none has room."""

    def __init__(self, ask: Callable[[], Any], wants: str) -> None:
        self._ask_actor, self.wants = ask, wants
        self._free: list[Slot] = []  # free slots, free longest first
        self._freed = threading.Condition()
        self._lock = threading.Lock()
        self._actors: list[Any] = []  # live or pending, to kill on stop
        self._placing: list[threading.Thread] = []  # waiting for a node with room

    @property
    def live(self) -> int:
        with self._lock:
            return len(self._actors)

    def start(self, slots: int) -> None:
        """Ask for `slots` slots and wait for the first to be placed and checked (then a
        short while for the others); slots not placed yet join when a node has room."""
        waiting = [self._ask() for _ in range(slots)]
        deadline = time.monotonic() + PLACE_TIMEOUT_S
        while waiting and time.monotonic() < deadline:
            done, _ = ray.wait([ref for _, ref in waiting], num_returns=1,
                               timeout=deadline - time.monotonic())
            for pair in [p for p in waiting if p[1] in done]:
                waiting.remove(pair)
                self._placed(*pair)  # raises a node's error
            if self._free:
                deadline = min(deadline, time.monotonic() + OTHERS_GRACE_S)
        if not self._free:
            self.stop_all()
            raise BisectError(
                f"no node of the Ray cluster had room for a trial slot ({self.wants}) within "
                f"{PLACE_TIMEOUT_S:.0f} s",
                "check `ray status`: each node needs the engine's GPUs and one unit of the "
                "profile's bisect.node_resource")
        for pair in waiting:
            self._place_in_background(pair)

    def acquire(self, state: str | None) -> Slot:
        """A free slot: the one free longest whose engine is up in `state` (the trial is then
        a hot switch there, not a launch), else the one free longest."""
        with self._freed:
            while True:
                if self._free:
                    slot = next((s for s in self._free if state is not None
                                 and state in s.engines), self._free[0])
                    self._free.remove(slot)
                    return slot
                if not self.live:
                    raise BisectError("every trial slot of the Ray cluster was lost",
                                      "check `ray status`, then resume the bisect")
                self._freed.wait(timeout=1.0)

    def idle(self, share: int, state: str | None) -> list[Slot]:
        """Up to `share` free slots for a trial's replicas, those whose engine is up in its
        load-time `state` first (a switch, not a launch)."""
        with self._freed:
            taken = sorted(self._free, key=lambda s: state not in s.engines)[:share]
            for slot in taken:
                self._free.remove(slot)
        return taken

    def any_free(self) -> bool:
        with self._freed:
            return bool(self._free)

    def release(self, slot: Slot) -> None:
        with self._freed:
            self._free.append(slot)
            self._freed.notify()

    def lost(self, slot: Slot) -> None:
        """The slot's actor died: forget it and ask for a replacement (placed when there is
        room: at once if only the worker died, never if its node is gone and no other has
        room)."""
        with self._lock:
            if slot.actor in self._actors:
                self._actors.remove(slot.actor)
        try:  # unreachable may not mean dead: make sure, so its reaper stops its engines
            ray.kill(slot.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self._place_in_background(self._ask())

    def close(self) -> None:
        """Every actor stops its engines and is killed (stop_all), and the placements still
        waiting for room end with their actor."""
        self.stop_all()
        with self._lock:
            placing = list(self._placing)
        for thread in placing:
            thread.join(timeout=STOP_TIMEOUT_S)

    def stop_all(self) -> None:
        """Ctrl-C: every actor stops its engines (bounded wait), then every actor is killed
        (its reaper stops whatever is left)."""
        with self._lock:
            actors = list(self._actors)
            self._actors.clear()
        refs = []
        for actor in actors:
            try:
                refs.append(actor.stop.remote())
            except Exception:  # noqa: BLE001 - an actor already gone
                continue
        if refs:
            try:
                ray.wait(refs, num_returns=len(refs), timeout=STOP_TIMEOUT_S)
            except (GetTimeoutError, RayActorError):
                pass
        for actor in actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                continue

    def _ask(self) -> tuple[Any, Any]:
        actor = self._ask_actor()
        with self._lock:
            self._actors.append(actor)
        return actor, actor.ready.remote()

    def _placed(self, actor: Any, ref: Any) -> None:
        try:
            info = ray.get(ref)
        except (RayActorError, ActorUnavailableError):
            return  # died before its first trial: nothing lost
        if info["error"] is not None:
            self.stop_all()
            raise rt.node_error(info["error"], info["node"]["name"])
        self.release(Slot(actor, info["node"]["name"], info["node"].get("ip")))

    def _place_later(self, actor: Any, ref: Any) -> None:
        try:
            self._placed(actor, ref)
        except Dsv4BisectError as exc:  # a node that joined later and fails its checks
            logging.getLogger(__name__).warning("%s", exc.message)

    def _place_in_background(self, pair: tuple[Any, Any]) -> None:
        thread = threading.Thread(target=self._place_later, args=pair, daemon=True)
        with self._lock:
            self._placing.append(thread)
        thread.start()
