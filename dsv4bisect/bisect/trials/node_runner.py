"""The one factory of the runner that runs trials on this machine, for every executor.

A local bisect calls `node_runner(request)` on the machine it runs on; the Ray executor
(bisect/cluster/ray_executor.py) calls the same function inside its actor on each node and keeps the
object alive across the trials the actor is sent. So whatever the local runner learns to do
across trials (an engine kept up and switched in place) happens on a node too, with no second
code path. `RunnerRequest` is everything that function needs, as plain JSON: it is what the
run file records for `--resume` and what travels to the nodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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

    def to_json(self) -> dict[str, Any]:
        return {"profile": self.profile, "good": dict(self.good), "sets": list(self.sets),
                "tier": self.tier, "use_cache": self.use_cache, "bad": dict(self.bad),
                "load_time": list(self.load_time), "policy": self.policy.to_json()}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RunnerRequest:
        return cls(str(doc["profile"]), dict(doc.get("good") or {}),
                   tuple(doc.get("sets") or ()), doc.get("tier"), bool(doc.get("use_cache", True)),
                   dict(doc.get("bad") or {}), tuple(doc.get("load_time") or ()),
                   TrialPolicy.from_json(doc))


def node_runner(request: RunnerRequest, on_event: EventSink = ignore) -> EngineRunner:
    """The runner of this machine's trials (resolves the ends here; launches nothing yet):
    hot switching where the policy says so (not `--fresh-launches`)."""
    if request.policy.hot:
        return HotEngineRunner(request.profile, request.good, request.bad,
                               load_time=request.load_time, sets=request.sets,
                               tier=request.tier, use_cache=request.use_cache,
                               policy=request.policy, on_event=on_event)
    return EngineRunner(request.profile, request.good, sets=request.sets, tier=request.tier,
                        use_cache=request.use_cache, on_event=on_event)
