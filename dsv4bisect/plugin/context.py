"""Who is this process? Role from the launcher's env, ranks from SGLang's scheduler frame.

SGLang calls `load_plugins()` at the top of `run_scheduler_process(server_args, port_args,
gpu_id, tp_rank, ..., pp_rank, dp_rank, ...)` — before the model is built — and also in the
engine's main process. The plugin walks the call stack to find that frame: its locals give the
TP/DP/PP rank and GPU of this scheduler. Without it the process is not a scheduler (the HTTP
server / tokenizer process), where no model is built and no hook is needed.
"""

from __future__ import annotations

import os
import sys
from types import FrameType

from dsv4bisect import env as envvars
from dsv4bisect.plugin.receipts import ProcessInfo

SCHEDULER_FUNCTION = "run_scheduler_process"


def _as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def frame_of(function: str, local: str, frame: FrameType | None) -> FrameType | None:
    """The first frame, from `frame` outwards, of `function` with `local` among its locals
    (the engine's process entry, which our plugin runs inside: SGLang's or vLLM's)."""
    while frame is not None:
        if frame.f_code.co_name == function and local in frame.f_locals:
            return frame
        frame = frame.f_back
    return None


def scheduler_frame(start: FrameType | None = None) -> FrameType | None:
    return frame_of(SCHEDULER_FUNCTION, "tp_rank",
                    start if start is not None else sys._getframe(1))


def current_process(start: FrameType | None = None) -> ProcessInfo:
    role = os.environ.get(envvars.ROLE, "unknown")
    frame = scheduler_frame(start if start is not None else sys._getframe(1))
    if frame is None:
        return ProcessInfo(pid=os.getpid(), role=role, kind="other")
    loc = frame.f_locals
    args = loc.get("server_args")
    dp_rank = _as_int(loc.get("dp_rank"))
    tp_size = _as_int(getattr(args, "tp_size", None))
    dp_size = _as_int(getattr(args, "dp_size", None))
    tp_rank = _as_int(loc.get("tp_rank"))
    if dp_rank is None and tp_rank is not None and tp_size and dp_size and dp_size > 1 \
            and getattr(args, "enable_dp_attention", False):
        dp_rank = tp_rank // (tp_size // dp_size)  # DP attention: ranks split the TP group
    return ProcessInfo(pid=os.getpid(), role=role, kind="scheduler", tp_rank=tp_rank,
                       dp_rank=dp_rank, pp_rank=_as_int(loc.get("pp_rank")),
                       gpu_id=_as_int(loc.get("gpu_id")), tp_size=tp_size, dp_size=dp_size)
