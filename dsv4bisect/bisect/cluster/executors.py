"""Where trials run: on this machine (`local`) or on the nodes of a Ray cluster (`ray`).

`executor_runner` is the one call the CLI makes to turn the local runner into the chosen
executor's. Ray is an optional extra imported only by bisect/cluster/ray_executor.py, and only here,
when `ray` is chosen.
"""

from __future__ import annotations

from dsv4bisect.bisect.trials.engine_runner import EngineRunner
from dsv4bisect.bisect.trials.node_runner import RunnerRequest
from dsv4bisect.bisect.trials.runner import Runner
from dsv4bisect.errors import ConfigError

EXECUTORS = ("local", "ray")


def executor_runner(executor: str, local: EngineRunner, request: RunnerRequest,
                    parallel: int, *, address: str | None = None, node_resource: str | None = None,
                    preflight: bool = True, shard: bool = True, ends: str | None = None) -> Runner:
    """`local` as it is, or a `RayRunner` with `parallel` node slots that runs `request`'s
    trials on the cluster at `address` (`local` resolves and fingerprints on the driver).
    `shard`: a trial may split its probe across the round's idle nodes (docs/cluster.md);
    `ends`: how the ends run then (bisect/rounds.py: the plan's `choose_ends`)."""
    if executor == "local":
        return local
    if executor != "ray":
        raise ConfigError(f"unknown executor `{executor}`", f"use one of {', '.join(EXECUTORS)}")
    try:
        from dsv4bisect.bisect.cluster.ray_executor import RayRunner
    except ImportError as exc:
        raise ConfigError(f"--executor ray needs Ray, which is not installed ({exc})",
                          "pip install 'dsv4bisect[ray]' (on the driver and on every node)"
                          ) from None
    return RayRunner(request, local, parallel, address=address, node_resource=node_resource,
                     preflight=preflight, shard=shard, ends=ends)
