"""The one factory of the runner that runs trials on this machine, for every executor.

A local bisect calls `node_runner(request)` on the machine it runs on; the Ray executor
(bisect/cluster/ray_executor.py) calls the same function inside its actor on each node and keeps the
object alive across the trials the actor is sent. So whatever the local runner learns to do
across trials (an engine kept up and switched in place) happens on a node too, with no second
code path. `RunnerRequest` is everything that function needs, as plain JSON, with the trial
policy and what the executor and a report need besides (the test command, where the Ray
executor's trials go, what was left out, the command line): it is the run file's request, what
`--resume` rebuilds the runner from, and what travels to the nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from dsv4bisect.bisect.trials.engine_runner import EngineRunner
from dsv4bisect.bisect.trials.hot_runner import HotEngineRunner
from dsv4bisect.policy import DEFAULT_POLICY, TrialPolicy
from dsv4bisect.run.events import EventSink, ignore


@dataclass(frozen=True)
class RunnerRequest:
    profile: str
    good: Mapping[str, str]  # the good end's patch set
    sets: tuple[str, ...] = ()  # the user's --set items (patches.* dropped by the runner)
    tier: str | None = None
    use_cache: bool = True
    # hot switching (docs/hot-switching.md): the bad end as the search names it, and the
    # candidates whose effect is fixed at load
    bad: Mapping[str, str] = field(default_factory=dict)
    load_time: tuple[str, ...] = ()
    policy: TrialPolicy = DEFAULT_POLICY  # the bisect's (policy.hot False: --fresh-launches)
    test_cmd: str | list[str] | None = None  # a test command judges instead (its cwd: where)
    test_cwd: str | None = None
    # where the Ray executor's trials go: the cluster's head, the resource a node offers one
    # unit of, the node slots (None: one per trial of a round), how sharded ends run
    # (bisect/rounds.py, the node plan's choice)
    ray_address: str | None = None
    node_resource: str | None = None
    nodes: int | None = None
    ends: str | None = None
    left_out: tuple[tuple[str, str], ...] = ()  # for the report: (patch, why)
    # the bad end as `run` of the profile measures it: `bad` with the patches left out as
    # inert at their bad-end state (a failing run's cached candidate: end_probes.run_ends)
    run_bad: Mapping[str, str] = field(default_factory=dict)
    good_config: str | None = None  # --good-config as given: the trials' Reproduce lines name it
    command: tuple[str, ...] = ()  # the command line, for the report

    def to_json(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)},
                "good": dict(self.good), "sets": list(self.sets), "bad": dict(self.bad),
                "load_time": list(self.load_time), "policy": self.policy.to_json(),
                "left_out": [list(x) for x in self.left_out], "command": list(self.command),
                "run_bad": dict(self.run_bad)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RunnerRequest:
        """The request a run file (or a driver) wrote, also one written before the trial
        policy had its own key (TrialPolicy.from_json)."""
        get = {f.name: doc.get(f.name, f.default) for f in fields(cls)}
        return cls(**{**get, "profile": str(doc["profile"]), "good": dict(doc.get("good") or {}),
                      "sets": tuple(doc.get("sets") or ()), "bad": dict(doc.get("bad") or {}),
                      "use_cache": bool(doc.get("use_cache", True)),
                      "load_time": tuple(doc.get("load_time") or ()),
                      "policy": TrialPolicy.from_json(doc), "nodes": doc.get("nodes") or None,
                      "left_out": tuple(tuple(x) for x in doc.get("left_out") or ()),
                      "command": tuple(doc.get("command") or ()),
                      "run_bad": dict(doc.get("run_bad") or {})})


def node_runner(request: RunnerRequest, on_event: EventSink = ignore) -> EngineRunner:
    """The runner of this machine's trials (resolves the ends here; launches nothing yet):
    hot switching where the policy says so (not `--fresh-launches`)."""
    if request.policy.hot:
        return HotEngineRunner(request.profile, request.good, request.bad,
                               load_time=request.load_time, sets=request.sets,
                               tier=request.tier, use_cache=request.use_cache,
                               policy=request.policy, good_config=request.good_config,
                               run_bad=request.run_bad or None, on_event=on_event)
    return EngineRunner(request.profile, request.good, sets=request.sets, tier=request.tier,
                        use_cache=request.use_cache, good_config=request.good_config,
                        on_event=on_event)
