"""The Ray executor: each trial runs on a node of an existing Ray cluster (docs/cluster.md).

`RayRunner` is a `Runner` (bisect/trials/runner.py) on the driver. The driver keeps every decision
(re-runs, the ledger); `run()` sends one trial to a free actor — one actor per node slot, K
slots for `--parallel K` — waits for it and returns its `TrialResult`. Each actor asks for the
resources of the engine configuration (its GPUs) plus the profile's per-node custom resource
(`bisect.node_resource`; one unit per node means one slot holds a whole node), builds its
runner once with `node_runner` — the same factory and trial code as a local bisect — and keeps
it for every trial it is sent. Results come back as one archive of the trial directory per
trial (bisect/cluster/remote_trial.py), unpacked into the driver's trial directory.

`RayRunner` is the hot runner's three parts at the scale of a cluster: its engine pool is the
pool of node slots (cluster/slots.py: a trial goes to the free slot whose engine is up in the
trial's load-time state, a hot switch there, not a launch, else to the slot free longest); its
ends book is the driver's copy of the ends (cluster/shared_ends.py `DriverEnds`; hot runners:
the good end's baseline and A/A repeat and the bad end's run that a node's trial measured come
back beside its archive, and every later trial request carries the ends its slot's runner does
not have, which that runner installs before the trial, so no node measures a good end another
measured, and every node probes sequentially once one ran the bad end; seed block 0's ends that
a failing `run` cached on the driver's machine are in it before the first trial, so no node
measures them, with no cache of its own: `seed_run_ends`); its probing policy is
the hot runner's own (trials/probing.py: which trials shard their probe across the round's idle
slots, which bad end starts ahead of the good end's run).

Faults. Ray never re-runs anything (`max_restarts=0`, `max_task_retries=0`): an actor that
dies mid-trial (its worker killed, its node's raylet gone) makes that trial CANNOT_TEST with a
signature naming the node; the driver retries it once, on whichever slot is free first, and a
replacement actor is asked for in the background (placed when a node has room). On each node a
reaper (engines/reaper.py) beside every actor stops the engines that actor recorded once it is
gone, so a killed worker, a lost driver (Ray ends its job's actors with it) or Ctrl-C
(`stop_all`) leaves no engine. A node's preflight failure or identity mismatch is the same
one-line error as locally, naming the node.

This module and its slots (cluster/slots.py) are the only ones that import Ray (`pip install
'dsv4bisect[ray]'`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from dsv4bisect.bisect.cluster import remote_trial as rt
from dsv4bisect.bisect.cluster.shared_ends import DriverEnds, seed_run_ends
from dsv4bisect.bisect.cluster.slots import Slot, SlotPool
from dsv4bisect.bisect.rounds import ALONE, BESIDE
from dsv4bisect.bisect.trials.engine_runner import EngineRunner
from dsv4bisect.bisect.trials.node_runner import RunnerRequest, node_runner
from dsv4bisect.bisect.trials.probing import ProbingPolicy
from dsv4bisect.bisect.trials.runner import TrialResult, TrialRunner
from dsv4bisect.engines import reaper
from dsv4bisect.engines.groups import stop_orphans
from dsv4bisect.env import cache_dir
from dsv4bisect.errors import BisectError, Dsv4BisectError
from dsv4bisect.probe import verdict as V

NODE_LOST = "node-lost"  # signature prefix of a trial whose actor died


class TrialActor:
    """One node slot: a node runner kept across trials, a reaper beside it."""

    def __init__(self, request: Mapping[str, Any], preflight: bool) -> None:
        self.node_id = ray.get_runtime_context().get_node_id()
        self.node = {"name": node_name(self.node_id), "node_id": self.node_id,
                     "ip": ray.util.get_node_ip_address()}
        self.scratch = cache_dir() / "ray-trials" / self.node_id[:12]
        stop_orphans(self.scratch)  # what an actor before us left, if its reaper died too
        self._reaper = reaper.spawn(self.scratch)
        self.error: dict[str, Any] | None = None
        self.runner: EngineRunner | None = None
        req = RunnerRequest.from_json(request)
        try:
            if preflight:  # the same checks and one-line errors as a local bisect's
                from dsv4bisect.config.resolve import Overrides
                from dsv4bisect.engines.preflight import require

                require(req.profile, Overrides(sets=tuple(req.sets)))
            self.runner = node_runner(req)
        except Dsv4BisectError as exc:
            self.error = rt.error_json(exc)

    def ready(self) -> dict[str, Any]:
        return {"node": self.node, "error": self.error}

    def _on_node(self, call: Callable[..., dict[str, Any]], trial: Mapping[str, Any],
                 *args: Any) -> dict[str, Any]:
        """`call` (remote_trial's) with this slot's runner, or the error that left it none."""
        if self.error is not None or self.runner is None:
            return {"error": self.error}
        return call(self.runner, rt.NodeTrial.from_json(trial), self.scratch, self.node, *args)

    def run(self, trial: Mapping[str, Any], ends: bytes | None = None,
            replicas: tuple[str, ...] = ()) -> dict[str, Any]:
        return self._on_node(rt.run_on_node, trial, ends, replicas)

    def ahead(self, trial: Mapping[str, Any], replicas: tuple[str, ...] = ()) -> dict[str, Any]:
        """Start a bad end's probe before the good end's run exists (remote_trial.ahead_on_node);
        the next `run` of the same trial finishes it."""
        return self._on_node(rt.ahead_on_node, trial, replicas)

    def replica(self, trial: Mapping[str, Any]) -> dict[str, Any]:
        """This node's engine in `trial`'s configuration, for another node's trial to send a
        share of its probe to (remote_trial.replica_on_node)."""
        return {**self._on_node(rt.replica_on_node, trial), "started": time.time()}

    def stop(self) -> None:
        """Stop the engines of the trial in flight (runs beside `run`: max_concurrency=2)."""
        if self.runner is not None:
            self.runner.stop_all()


def node_name(node_id: str) -> str:
    return f"{socket.gethostname()} ({ray.util.get_node_ip_address()}, node {node_id[:8]})"


def connect(address: str | None) -> None:
    """Join the cluster as its driver (`auto`: the one `ray start` left on this machine, or
    RAY_ADDRESS)."""
    if ray.is_initialized():
        return
    _cluster_errors_to_stderr()
    try:
        ray.init(address=address or "auto", log_to_driver=False, logging_level=logging.ERROR)
    except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BisectError(
            f"cannot join the Ray cluster at {address or 'auto'}: {first}",
            "start it (`ray start --head` on the head, `ray start --address HEAD:6379` on "
            "each node) and pass --ray-address HEAD:6379 (docs/cluster.md)") from None


def _cluster_errors_to_stderr() -> None:
    """Ray's driver prints the cluster's error messages ("Raylet is terminated", a node lost)
    to stdout, which is ours for results (`--json`): send them to stderr, with the rest of
    the display. (Ray looks the printer up by name each time it prints.)"""
    from ray._private import worker

    original = getattr(worker, "print_to_stdstream", None)
    if original is None or getattr(original, "_to_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        original({**data, "is_err": True}, ignore_prefix)

    to_stderr._to_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr


class _EndsRound:
    """A round that measures both ends at once (bisect/rounds.py, TOGETHER): the good end's
    trial has its slot (`placed`), and is back, its ends kept by the driver (`done`)."""

    def __init__(self, block: int) -> None:
        self.block = block  # the good end's seed block
        self.placed = threading.Event()
        self.done = threading.Event()


class RayRunner(TrialRunner):
    """The `Runner` that runs each trial on a node slot of a Ray cluster: a pool of slots, the
    driver's ends and the probing policy (see the module docstring)."""

    def __init__(self, request: RunnerRequest, local: EngineRunner, slots: int, *,
                 preflight: bool = True) -> None:
        from dsv4bisect.engines.preflight import named_gpus

        self.local, self.request = local, request
        self.probing = ProbingPolicy(request.good, request.bad, request.policy)
        # how the ends run, sharded (`policy.shard`: hot sequential trials only, as the plan
        # prices them): the plan's choice for these nodes and costs (plan/parallel_plan.py
        # `choose_ends`, made by the session and kept in the request for a resume)
        self.ends = request.ends or ALONE
        self._share = 0  # idle slots each trial of the round may take as replicas
        self._round: _EndsRound | None = None  # a round with the good end (TOGETHER)
        self._driver_ends: dict[Path, DriverEnds] = {}  # per bisect run directory
        self._lock = threading.Lock()
        connect(request.ray_address)
        resources = {request.node_resource: 1.0} if request.node_resource else {}
        gpus = len(named_gpus(local.good_cfg))
        actor_cls = ray.remote(TrialActor).options(
            num_cpus=0, num_gpus=gpus, resources=resources,
            max_restarts=0, max_task_retries=0, max_concurrency=2)
        wants = ", ".join([f"{gpus} GPUs"] + [f"{k}: {v:g}" for k, v in resources.items()])
        self.slots = SlotPool(lambda: actor_cls.remote(request.to_json(), preflight), wants)
        self.slots.start(slots)

    # -- the Runner protocol: fingerprints come from the driver's own resolution ---------------
    @property
    def probe_hash(self) -> str:
        return self.local.probe_hash

    @property
    def hot(self) -> bool:
        """Whether the nodes' runners switch hot (then no fresh confirmation runs: the report
        says so; docs/cluster.md)."""
        return self.request.policy.hot

    def fingerprint(self, patches: Mapping[str, str]) -> str:
        return self.local.fingerprint(patches)

    @property
    def ends_schedule(self) -> str | None:
        """How the driver runs the ends (bisect/rounds.py): sharded, alone in their round
        across every slot or together each across half of them; every other trial on a slot
        of its own. None: not sharding (each proposal on a slot of its own)."""
        return self.ends if self.request.policy.shard else None

    def begin_round(self, trials: int, good_block: int | None = None) -> None:
        """The driver starts a round of `trials` trials: the slots beyond them are idle for
        the round, so an end (alone in its round, or the two together) takes an equal share of
        the other slots as replicas; other trials take none (`_helpers`), nor do the ends with
        trials beside them (`BESIDE`). With the good end of seed block `good_block` in the
        round, the bad end of that block beside it (with `BESIDE`, every other trial) may start
        its probe ahead of the good end's run (`ProbingPolicy.starts_ahead`) and finishes it
        once that run is back (`_run`)."""
        shard = self.request.policy.shard
        # with trials beside the ends (BESIDE) the ends run unsharded, each on its own slot,
        # as the plan prices them; an end alone in its round is still split
        alone = trials == 1 or self.ends != BESIDE
        self._share = max(0, self.slots.live - trials) // max(trials, 1) if shard and alone else 0
        self._round = _EndsRound(good_block) if good_block is not None else None

    def run(self, patches: dict[str, str], seed_block: int, trial_dir: Path) -> TrialResult:
        here = self._round
        good = self.probing.is_good(patches)
        try:
            ends = self._ends_of(trial_dir.parent.parent)
            # an end of a block whose ends a failing `run` cached probes nothing: no replica
            # to switch, no probe to start ahead (`DriverEnds.keep_run`)
            probes = not (self.probing.is_end(patches) and ends is not None
                          and ends.from_run(seed_block))
            wait = here if probes and here is not None and self.probing.starts_ahead(
                patches, seed_block, here.block, self.ends_schedule) else None
            return self._run(patches, seed_block, trial_dir, ends, probes,
                             here if good else None, wait)
        finally:
            if good and here is not None:  # its ends are kept (or it failed): the bad end goes on
                here.done.set()

    def _run(self, patches: dict[str, str], seed_block: int, trial_dir: Path,
             ends: DriverEnds | None, probes: bool, good_of: _EndsRound | None,
             wait: _EndsRound | None) -> TrialResult:
        """One trial on a slot, with the driver's `ends` (None: fresh launches). `probes`:
        the trial sends requests (not an end of a block a `run` cached). `good_of`: this is
        the good end of that round (it says when it has its slot); `wait`: this is the bad end
        beside it, which starts its probe ahead (`_ahead`) and finishes it with the good end's
        run."""
        cfg = self.local.config(patches)
        trial = rt.NodeTrial(patches, seed_block, cfg.fingerprint, cfg.identity,
                             self.local.probe_hash, trial_dir.parent.parent.name, trial_dir.name)
        state = self._state_of(patches)
        slot = self.slots.acquire(state)
        if good_of is not None:
            good_of.placed.set()
        # only the ends' full-size probes are split across idle slots (trials/probing.py)
        helpers = self._helpers(ends, state) if probes and self.probing.is_end(patches) else []
        urls, replicas = self._replicas(slot, helpers, trial) if helpers else ((), {})
        t0 = time.perf_counter()
        try:
            ahead = self._ahead(slot, trial, urls, wait) if wait is not None else None
            sent, archive = ends.pack(exclude=slot.ends) if ends is not None else (
                frozenset(), None)
            reply = ray.get(slot.actor.run.remote(trial.to_json(), archive, urls))
        except (RayActorError, ActorUnavailableError) as exc:
            self.slots.lost(slot)
            return lost_result(slot.node, exc, time.perf_counter() - t0)
        except RayTaskError as exc:
            self.slots.release(slot)
            raise BisectError(f"node {slot.node}: the trial failed: {first_line(exc.cause)}",
                              "its traceback is in the node's Ray worker log") from None
        finally:
            for helper in helpers:
                if helper in replicas:
                    self.slots.release(helper)
        try:
            if replicas and "result" in reply:  # which nodes served a share of its probe
                shards = int(reply["result"]["details"].get("shards") or 1)
                reply["node"]["replicas"] = [
                    {**replicas[h], "finished": time.time()} for h in helpers
                    if h in replicas] if shards > 1 else []
            if ahead and "node" in reply:  # the probe began ahead of the good end's run
                reply["node"]["ahead"] = ahead
                reply["node"]["started"] = min(ahead["started"], reply["node"]["started"])
            result = rt.receive(reply, trial_dir, slot.node)
            if ends is not None:
                ends.keep(reply.get("ends"))
                measured = result.details.get("ends_measured") or ()
                slot.ends = slot.ends | sent | frozenset(measured)
            slot.engines = tuple(reply.get("engines") or ())
        finally:
            self.slots.release(slot)
        return result

    # -- both ends at once: the bad end's probe ahead of the good end's run ----------------
    def _ahead(self, slot: Slot, trial: rt.NodeTrial, urls: tuple[str, ...],
               round_: _EndsRound) -> dict[str, Any] | None:
        """The bad end's accuracy requests on its slot and replicas while the good end runs
        (remote_trial.ahead_on_node), then the wait for the good end's trial to be back (its
        run kept in the driver's ends, which the trial's request then carries). Its record
        for the report: when it started and ended, the rows it sent. Without a slot for the
        good end (none free, none placed for it), it waits no longer: the trial then measures
        the good end itself, as unsharded (no round waits on a slot this one holds)."""
        reply = ray.get(slot.actor.ahead.remote(trial.to_json(), urls))
        if "error" in reply:  # the trial itself meets it again, and says it
            logging.getLogger(__name__).warning("node %s cannot start the bad end ahead: %s",
                                                slot.node, (reply["error"] or {}).get("message"))
            return None
        slot.engines = tuple(reply.get("engines") or slot.engines)
        while not round_.done.wait(timeout=1.0):
            if not round_.placed.is_set() and not self.slots.any_free():
                logging.getLogger(__name__).warning(
                    "the good end has no slot: the bad end on %s goes on without its run",
                    slot.node)
                break
        return {"started": reply["started"], "finished": reply["finished"],
                "rows": int(reply.get("rows") or 0), "resumed": time.time()}

    # -- sharded probes: an end's probe on every idle node (docs/cluster.md) ----------------
    def _helpers(self, ends: DriverEnds | None, state: str | None) -> list[Slot]:
        """Idle slots for this trial's replicas (hot runners only): its share of the round's
        idle slots, those whose engine is up in its load-time state first."""
        if not self._share or ends is None:
            return []
        return self.slots.idle(self._share, state)

    def _replicas(self, slot: Slot, helpers: list[Slot], trial: rt.NodeTrial
                  ) -> tuple[tuple[str, ...], dict[Slot, dict[str, Any]]]:
        """Each helper's engine up and switched to the trial's configuration (at once); the
        urls of those that are, and per helper its node record. A helper that cannot serve is
        released (or, lost, replaced) and the trial runs without it."""
        refs = [h.actor.replica.remote(trial.to_json()) for h in helpers]
        urls: list[str] = []
        replicas: dict[Slot, dict[str, Any]] = {}
        for helper, ref in zip(helpers, refs):
            try:
                reply = ray.get(ref)
            except (RayActorError, ActorUnavailableError):
                self.slots.lost(helper)
                continue
            except RayTaskError:
                self.slots.release(helper)
                continue
            helper.engines = tuple(reply.get("engines") or helper.engines)
            why = _not_a_replica(reply, helper, slot)
            if why:
                logging.getLogger(__name__).warning("%s", why)
                self.slots.release(helper)
                continue
            urls.append(str(reply["url"]))
            replicas[helper] = {"name": reply["node"]["name"],
                                "node_id": reply["node"]["node_id"], "started": reply["started"]}
        return tuple(urls), replicas

    # -- the ends and the engines the nodes have (docs/cluster.md, "The ends travel") ---------
    def _ends_of(self, run_dir: Path) -> DriverEnds | None:
        """The driver's copy of the bisect's ends (hot runners only: a fresh-launch runner
        judges against its node's baseline cache), with seed block 0's ends from the cache a
        failing `run` left on this machine where it has them, before the first trial request
        (`seed_run_ends`)."""
        if not self.hot:
            return None
        with self._lock:
            ends = self._driver_ends.get(run_dir)
            if ends is None:
                ends = self._driver_ends[run_dir] = DriverEnds(run_dir)
                seed_run_ends(ends, self.local)
            return ends

    def _state_of(self, patches: Mapping[str, str]) -> str | None:
        """The engine a trial of `patches` runs in on a node (its load-time state), as the
        nodes' runners name it; None for fresh launches."""
        return self.local.engine_key(patches) if self.hot else None

    def close(self) -> None:
        """The bisect is over (or interrupted): every actor stops its engines and is killed,
        and the placements still waiting for room end with their actor. Without it a placement
        thread still inside Ray at interpreter exit makes Ray's core worker end the process
        with status 1 after a successful bisect. The driver stays connected: Ray disconnects
        at exit, and a trial thread of an interrupted round may still be in a `ray.get` (it
        returns with the actor's death), which `ray.shutdown()` here would crash."""
        self.slots.close()

    def stop_all(self) -> None:
        """Ctrl-C: every actor stops its engines (bounded wait), then every actor is killed
        (its reaper stops whatever is left)."""
        self.slots.stop_all()


def _not_a_replica(reply: Mapping[str, Any], helper: Slot, slot: Slot) -> str | None:
    """Why a helper's reply cannot serve as a replica of `slot`'s trial (None: it can)."""
    if "error" in reply:
        return (f"node {helper.node} cannot serve a replica: "
                f"{(reply['error'] or {}).get('message')}")
    if not rt.reaches(str(reply["url"]), slot.ip, reply["node"].get("ip")):
        return (f"node {helper.node}'s engine listens on loopback ({reply['url']}): not a "
                f"replica for a trial on {slot.node}; set engine.host=0.0.0.0 to shard "
                "across machines")
    return None


def lost_result(node: str, exc: BaseException, duration_s: float) -> TrialResult:
    """A trial whose actor died under it: not the configuration's fault, never evidence."""
    return TrialResult(verdict=V.CANNOT_TEST, signature=f"{NODE_LOST}: {node}",
                       duration_s=duration_s,
                       details={"node": {"name": node}, "error": first_line(exc)})


def first_line(exc: object) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
