"""An upstream SGLang switch as a patch: nothing to hook, only proof that SGLang kept it.

The resolver sets the switch's env var in the engine processes and lists every switch it set in
DSV4BISECT_SWITCHES (`VAR=V,...`). SGLang may still change it before the schedulers start (its
server-args post-processing forces some DeepSeek-V4 flags per GPU, and turns FP8 wo_a off when
DeepGEMM's JIT is missing), so the receipt compares, in the scheduler, the value SGLang's code
will read with the one asked for: equal → `installed` (nothing to call: `expects_call` is
empty), different → `refused` with both values. Imports no torch and no SGLang.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from dsv4bisect import env as envvars
from dsv4bisect.patchspec.plan import Plan


def asked() -> dict[str, str]:
    pairs = (p.partition("=") for p in os.environ.get(envvars.SWITCHES, "").split(",") if p)
    return {k: v for k, _, v in pairs}


def _truthy(value: str) -> str:
    low = value.strip().lower()
    return {"1": "true", "true": "true", "yes": "true", "0": "false", "false": "false",
            "no": "false"}.get(low, low)


def planner(variables: frozenset[str]) -> Callable[[str, str, object], Plan]:
    """A plan that checks `variables` (the patch's switch) against DSV4BISECT_SWITCHES."""

    def plan(variant: str, layout: str, rec: object) -> Plan:
        want = {k: v for k, v in asked().items() if k in variables}
        if not want:
            return Plan("refuse", reason=f"no value was asked for {', '.join(sorted(variables))} "
                        f"({envvars.SWITCHES} is missing them: launched outside dsv4bisect?)")
        wrong = [f"{k}: asked {v}, SGLang has {os.environ.get(k, '(unset)')}"
                 for k, v in want.items() if _truthy(os.environ.get(k, "")) != _truthy(v)]
        if wrong:
            return Plan("refuse", reason="SGLang changed the switch: " + "; ".join(wrong))
        return Plan("install", notes=tuple(f"{k}={v} as asked (read by SGLang itself)"
                                           for k, v in want.items()))

    return plan
