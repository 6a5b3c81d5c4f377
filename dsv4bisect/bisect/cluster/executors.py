"""Where trials run: on this machine (`local`) or on the nodes of a Ray cluster (`ray`).

`executor_runner` is the one call that turns the local runner into the trial policy's executor
(dsv4bisect/policy.py); `Placement` is where on the cluster, as the run's request keeps it for a
resume. Ray is an optional extra imported only by bisect/cluster/ray_executor.py, and only
here, when `ray` is chosen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dsv4bisect.bisect.trials.engine_runner import EngineRunner
from dsv4bisect.bisect.trials.node_runner import RunnerRequest
from dsv4bisect.bisect.trials.runner import Runner
from dsv4bisect.errors import ConfigError
from dsv4bisect.policy import Executor


@dataclass(frozen=True)
class Placement:
    """Where the Ray executor's trials go: the cluster's head (None: `RAY_ADDRESS` or the local
    one), the custom resource each node offers one unit of, the node slots (None: one per
    trial of a round) and how the ends run when sharded (bisect/rounds.py; chosen by the node
    plan for these nodes and costs, None: not chosen)."""

    ray_address: str | None = None
    node_resource: str | None = None
    nodes: int | None = None
    ends: str | None = None

    def slots(self, parallel: int) -> int:
        return self.nodes or parallel

    def to_json(self) -> dict[str, Any]:
        return {"ray_address": self.ray_address, "node_resource": self.node_resource,
                "nodes": self.nodes, "ends": self.ends}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Placement:
        nodes = doc.get("nodes")
        return cls(doc.get("ray_address"), doc.get("node_resource"),
                   int(nodes) if nodes else None, doc.get("ends"))


def executor_runner(local: EngineRunner, request: RunnerRequest, placement: Placement,
                    parallel: int, *, preflight: bool = True) -> Runner:
    """`local` as it is, or a `RayRunner` whose node slots (`placement`, at least `parallel`)
    run `request`'s trials on the cluster (`local` resolves and fingerprints on the driver),
    as the request's trial policy says (its executor; whether idle nodes shard the ends'
    probes: docs/cluster.md)."""
    if request.policy.executor is Executor.LOCAL:
        return local
    try:
        from dsv4bisect.bisect.cluster.ray_executor import RayRunner
    except ImportError as exc:
        raise ConfigError(f"--executor ray needs Ray, which is not installed ({exc})",
                          "pip install 'dsv4bisect[ray]' (on the driver and on every node)"
                          ) from None
    return RayRunner(request, local, placement.slots(parallel), address=placement.ray_address,
                     node_resource=placement.node_resource, ends=placement.ends,
                     preflight=preflight)
