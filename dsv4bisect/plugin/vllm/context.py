"""Who is this process? A vLLM worker, with its ranks, or another vLLM process.

vLLM calls `load_general_plugins()` at the top of `WorkerWrapperBase.init_worker(all_kwargs)`
(`vllm/v1/worker/worker_base.py`, every verified release), before the worker class is resolved
and before the model is built; also in the engine core, the API server and the argument parsing,
where no model is built. The plugin walks the call stack to the `init_worker` frame: its `self`
(the wrapper: `rpc_rank`) and `all_kwargs[rpc_rank]` (`rank`, `local_rank`, `vllm_config`) give
this worker's ranks. Without it the process is not a worker (yet): `plugin/vllm/__init__.py`
then wraps `init_worker` so that a worker forked later installs the hooks itself.
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

from dsv4bisect import env as envvars
from dsv4bisect.plugin.context import _as_int, frame_of
from dsv4bisect.plugin.receipts import ProcessInfo

WORKER_FUNCTION = "init_worker"


def worker_frame(start: FrameType | None = None) -> FrameType | None:
    return frame_of(WORKER_FUNCTION, "all_kwargs",
                    start if start is not None else sys._getframe(1))


def worker_info(wrapper: Any, all_kwargs: Any) -> ProcessInfo:
    """The ranks of the worker `wrapper.init_worker(all_kwargs)` starts. Within one data-parallel
    replica vLLM numbers workers tp-fastest: rank = pp_rank · tp + tp_rank."""
    role = os.environ.get(envvars.ROLE, "unknown")
    rpc = _as_int(getattr(wrapper, "rpc_rank", 0)) or 0
    kwargs = all_kwargs[rpc] if isinstance(all_kwargs, (list, tuple)) and rpc < len(
        all_kwargs) else {}
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    config = kwargs.get("vllm_config")
    parallel = getattr(config, "parallel_config", None)
    tp = _as_int(getattr(parallel, "tensor_parallel_size", None))
    dp = _as_int(getattr(parallel, "data_parallel_size", None))
    rank = _as_int(kwargs.get("rank"))
    tp_rank = pp_rank = None
    if rank is not None and tp:
        tp_rank, pp_rank = rank % tp, rank // tp
    return ProcessInfo(pid=os.getpid(), role=role, kind="worker", tp_rank=tp_rank,
                       dp_rank=_as_int(getattr(parallel, "data_parallel_rank", None)),
                       pp_rank=pp_rank, gpu_id=_as_int(kwargs.get("local_rank")), tp_size=tp,
                       dp_size=dp)


def current_process(start: FrameType | None = None) -> ProcessInfo:
    frame = worker_frame(start if start is not None else sys._getframe(1))
    if frame is None:
        return ProcessInfo(pid=os.getpid(), role=os.environ.get(envvars.ROLE, "unknown"),
                           kind="other")
    return worker_info(frame.f_locals.get("self"), frame.f_locals.get("all_kwargs"))
