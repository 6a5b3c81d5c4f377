"""Where trials run: on this machine (`local`) or on the nodes of a Ray cluster (`ray`).

`executor_runner` is the one call that turns the local runner into the executor the trial
policy names (dsv4bisect/policy.py), placed as the run's request says. Ray is an optional extra
imported only by the Ray executor (bisect/cluster/ray_executor.py, slots.py), and only here,
when `ray` is chosen.
"""

from __future__ import annotations

from dsv4bisect.bisect.trials.engine_runner import EngineRunner
from dsv4bisect.bisect.trials.node_runner import RunnerRequest
from dsv4bisect.bisect.trials.runner import Runner
from dsv4bisect.errors import ConfigError
from dsv4bisect.policy import Executor


def executor_runner(local: EngineRunner, request: RunnerRequest, parallel: int, *,
                    preflight: bool = True) -> Runner:
    """`local` as it is, or a `RayRunner` whose node slots (`request.nodes`, else one per
    trial of a round of `parallel`) run `request`'s trials on its cluster (`local` resolves
    and fingerprints on the driver)."""
    if request.policy.executor is Executor.LOCAL:
        return local
    try:
        from dsv4bisect.bisect.cluster.ray_executor import RayRunner
    except ImportError as exc:
        raise ConfigError(f"--executor ray needs Ray, which is not installed ({exc})",
                          "pip install 'dsv4bisect[ray]' (on the driver and on every node)"
                          ) from None
    return RayRunner(request, local, request.nodes or parallel, preflight=preflight)
