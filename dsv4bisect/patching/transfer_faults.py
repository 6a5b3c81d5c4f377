"""Field faults of the PD transfer path, selected by a setting rather than a patch variant:
`engine.pd.transfer_fault` (profile key; the engine processes read DSV4BISECT_PD_TRANSFER_FAULT).

They are faults of a transfer backend's code or of the decode server's state pool, not of an op
a patch swaps, so they belong to the PD settings and are bisected as settings (docs/bisect.md,
"A transfer backend and its fault"). `dsv4bisect patches list` and `patches show
engine.pd.transfer_fault` list them with their citations. The embedded engine implements them
where the real bugs acted (reference/pd/transfer.py, reference/pd/roles.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from dsv4bisect import env as envvars
from dsv4bisect.errors import ConfigError, did_you_mean

SETTING = "engine.pd.transfer_fault"


@dataclass(frozen=True)
class TransferFault:
    name: str
    summary: str
    backend: str | None  # the only backend it acts on (None: every backend)
    citation: str
    showed: str


TRANSFER_FAULTS = (
    TransferFault(
        "state-not-sent",
        "the Mooncake backend never sends DeepSeek-V4's SWA, compress-state and indexer "
        "compress-state buffers (its maybe_send_extra has no branch for their state type and "
        "returns 0); KV and metadata arrive, and the decode server reads whatever its "
        "state-pool slot held",
        "mooncake",
        "sglang PR #24878 (merged 2026-05)",
        "GSM8K's 'Janet' answer `#### 18` became `#### 84` (a few-shot example's answer "
        "regurgitated), worst when the prompt ends on `<think>`; found by a three-arm A/B: "
        "monolithic right, PD with NIXL right, PD with Mooncake wrong; localised by reading the "
        "backend's DeepSeek-V4 state branch, which NIXL had"),
    TransferFault(
        "stale-slot",
        "the decode server writes a transferred state into its state-pool slot only while the "
        "slot is new; a reused slot keeps its last occupant's SWA window and compressor / "
        "indexer windows, so requests start going wrong once every slot of the pool (SGLang's "
        "DecodeReqToTokenPool size: max_running_requests, plus twice that at 32 or fewer) has "
        "been used once",
        None,
        "vllm#52448 (closed; its onset), modelled as pool-slot reuse (issue 45)",
        "think-until-cap or empty turns in 298 of 1024 replayed requests (29.1 %): 0 % of the "
        "first 256, 67 % of the last bucket; suppressed by --enforce-eager, almost by "
        "VLLM_USE_BREAKABLE_CUDAGRAPH=0; the thread's root cause was found by ablation only, "
        "so the mechanism here (a slot's state not refreshed on reuse, the stale state "
        "PR #24878's decode read) is a model of its onset, not its code"),
)
BY_NAME = {f.name: f for f in TRANSFER_FAULTS}


def check_fault(name: str | None) -> str | None:
    """`name` if it is a transfer fault (None stays None), else ConfigError."""
    if name is None or name in BY_NAME:
        return name
    guess = did_you_mean(name, list(BY_NAME))
    raise ConfigError(f"unknown PD transfer fault `{name}`",
                      f"{guess + ' ' if guess else ''}faults: {', '.join(BY_NAME)}")


def acts_on(name: str, backend: str) -> bool:
    """Whether fault `name` changes anything under transfer `backend`."""
    fault = BY_NAME[name]
    return fault.backend is None or fault.backend == backend


def fault_from_env() -> str | None:
    """The fault an engine process was launched with (DSV4BISECT_PD_TRANSFER_FAULT)."""
    return check_fault(os.environ.get(envvars.PD_TRANSFER_FAULT) or None)
