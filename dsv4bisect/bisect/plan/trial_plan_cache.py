"""The sequential trial probe's simulated size, cached: `plan_trial` (probe/sequential_plan.py)
simulates 800 trials of the probe spec (a minute or more of CPU on a large tier) before every
`bisect` and `--plan`, and gives the same figures every time for the same spec, error rates and
code. An entry is `$DSV4BISECT_CACHE/trial-plans/<key>.json`, the key a hash of the probe spec
(its spec hash), the error rates, and the sources of the probe package and of bisect/plan
(where a look's trials are simulated: look_world.py); a damaged entry is ignored and simulated
again. JSON keeps a float's exact value, so the figures are the same bits.
"""

from __future__ import annotations

import dataclasses

from dsv4bisect.base.atomic import write_json
from dsv4bisect.base.bounded import load_json
from dsv4bisect.config.fingerprint import digest, source_hash
from dsv4bisect.env import cache_dir
from dsv4bisect.errors import ConfigError

SCHEMA = "dsv4bisect.trial-plan-cache/2"


def planned_trial(spec: object, false_fail: float, false_pass: float, *,
                  loss_rate: float | None = None, sims: int | None = None) -> object:
    """`plan_trial(spec, false_fail, false_pass, loss_rate=..., sims=...)` (default: the
    smallest loss of the verdict table, `PLAN_SIMS` trials each way), from the cache where it
    was simulated before."""
    from dsv4bisect.bisect.plan.look_world import look_trial
    from dsv4bisect.probe.sequential_plan import (
        PLAN_SIMS,
        SMALLEST_LOSS,
        TrialProbePlan,
        plan_trial,
    )

    loss = SMALLEST_LOSS if loss_rate is None else loss_rate
    runs = PLAN_SIMS if sims is None else sims
    key = digest({"schema": SCHEMA, "spec": spec.spec_hash(),  # type: ignore[attr-defined]
                  "noise": [false_fail, false_pass], "loss": loss, "sims": runs,
                  "code": source_hash("probe", "bisect/plan")}, length=24)
    path = cache_dir() / "trial-plans" / f"{key}.json"
    fields = [f.name for f in dataclasses.fields(TrialProbePlan)]
    try:
        data = load_json(path, "run") if path.is_file() else None
        if isinstance(data, dict) and data.get("schema") == SCHEMA and data.get("key") == key:
            return TrialProbePlan(**{name: data["plan"][name] for name in fields})
    except (OSError, ValueError, TypeError, KeyError, ConfigError):
        pass  # damaged: simulated again below
    if spec.case_share < 1.0:  # type: ignore[attr-defined]
        # a look of the ends keeps part of each stratum (look_world.py): the trials replay it
        plan = look_trial(spec, false_fail, false_pass, loss, runs)  # type: ignore[arg-type]
    else:
        plan = plan_trial(spec, false_fail, false_pass,  # type: ignore[arg-type]
                          loss_rate=loss, sims=runs)
    try:
        write_json(path, {"schema": SCHEMA, "key": key, "plan": dataclasses.asdict(plan)})
    except OSError:
        pass
    return plan
