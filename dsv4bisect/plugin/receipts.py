"""Receipts: one JSON record per patch per SGLang scheduler process, written atomically.

A receipt says who (pid, role, TP/DP/PP rank, GPU), what (patch, variant, SGLang version and
layout, the hook targets) and the outcome: `state` is `installed` (hooks applied), `inert`
(SGLang already behaves like the patch; nothing to hook), `refused` (the plugin would not
install it: unknown layout, signature mismatch, unsupported variant) or `failed` (an error while
installing). Hooks that run in the forward pass add evidence the first time they are called
(`called[target]`), so the launcher can tell an installed hook from one that is never reached
(e.g. the SM120 decode entry on another GPU). The routed-scaling contract check writes its own
record per process (`contract`). Imports no torch.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dsv4bisect.base.atomic import write_json

SCHEMA = 1
OK_STATES = ("installed", "inert")
CONTRACT = "routed-scaling-contract"  # the `patch` field of contract records


@dataclass(frozen=True)
class ProcessInfo:
    """The process writing receipts. Ranks are None outside a scheduler process."""

    pid: int
    role: str  # DSV4BISECT_ROLE: server | prefill | decode (unknown when unset)
    kind: str  # scheduler (SGLang) | worker (vLLM) | other
    tp_rank: int | None = None
    dp_rank: int | None = None
    pp_rank: int | None = None
    gpu_id: int | None = None
    tp_size: int | None = None
    dp_size: int | None = None

    @property
    def tag(self) -> str:
        ranks = f"tp{self.tp_rank}-dp{self.dp_rank or 0}-pp{self.pp_rank or 0}"
        ranked = self.kind in ("scheduler", "worker")
        return f"{self.role}-{ranks if ranked else 'proc'}-pid{self.pid}"


@dataclass
class Receipt:
    patch: str
    variant: str
    process: ProcessInfo
    sglang_version: str | None
    layout: str | None
    targets: list[str]
    state: str
    reason: str | None = None
    hooks: list[dict[str, Any]] = field(default_factory=list)  # {target, type, applied}
    expects_call: list[str] = field(default_factory=list)  # targets on the forward path
    called: dict[str, float] = field(default_factory=dict)  # target -> first call (epoch s)
    notes: list[str] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)  # per-layer logs (dispatch, contract)
    schema: int = SCHEMA
    written_at: float = 0.0
    engine: str = "sglang"  # the engine kind whose plugin wrote it: sglang | vllm
    vllm_version: str | None = None  # vLLM's receipts: the release (sglang_version is None)
    rebound: list[str] = field(default_factory=list)  # vLLM: modules whose copy was rebound

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def receipt_path(directory: Path, process: ProcessInfo, patch: str) -> Path:
    return directory / f"{process.tag}--{patch}.json"


class ReceiptWriter:
    """Writes and updates the receipts of one process. Thread-safe; every write is atomic
    (temp file + rename), so the launcher never reads half a record."""

    def __init__(self, directory: Path | None, process: ProcessInfo) -> None:
        self.directory = directory
        self.process = process
        self._lock = threading.Lock()
        self._records: dict[str, Receipt] = {}

    def write(self, receipt: Receipt) -> None:
        with self._lock:
            self._records[receipt.patch] = receipt
            self._flush(receipt)

    def mark_called(self, patch: str, target: str) -> None:
        """Record the first call of a hooked target (cheap after the first time)."""
        with self._lock:
            rec = self._records.get(patch)
            if rec is None or target in rec.called:
                return
            rec.called[target] = time.time()
            self._flush(rec)

    def update_detail(self, patch: str, key: str, value: Any) -> None:
        with self._lock:
            rec = self._records.get(patch)
            if rec is None:
                return
            rec.detail.setdefault(key, []).append(value)
            self._flush(rec)

    def get(self, patch: str) -> Receipt | None:
        return self._records.get(patch)

    def _flush(self, rec: Receipt) -> None:
        if self.directory is None:
            return
        rec.written_at = time.time()
        path = receipt_path(self.directory, self.process, rec.patch)
        write_json(path, rec.to_json(), indent=1, default=str)


def load_receipt(path: Path) -> dict[str, Any]:
    """One receipt as a dict (raises ValueError on a malformed file)."""
    from dsv4bisect.base.bounded import load_json
    from dsv4bisect.errors import ConfigError

    try:
        data = load_json(path, "run")
    except ConfigError as exc:  # the callers treat a bad receipt as a ValueError
        raise ValueError(exc.message) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or "patch" not in data:
        raise ValueError(f"{path.name} is not a dsv4bisect receipt (schema {SCHEMA})")
    return data
