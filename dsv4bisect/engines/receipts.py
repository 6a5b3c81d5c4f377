"""Reading the SGLang plugin's receipts after readiness: did every requested patch take effect?

Each scheduler process (TP × DP per SGLang server role) writes one receipt per requested
patch (`dsv4bisect.plugin.receipts`). `check_receipts` requires, for every process spec with
`gets_patches`, a receipt from each of its `schedulers` for each requested built-in patch, in
state `installed` or `inert`, and — for hooks on the forward path — evidence that the hooked
function was called (readiness runs a real generation and decode graphs are captured at
startup, so a hook never called is on a path this deployment does not take). Anything else is
a `PatchError` naming the patch, the role and the rank. The routed-scaling contract records
are summarised (layers where the factor is not applied exactly once become warnings; a
deliberate `double-scale` fault is expected to show up there).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4bisect.config.engine_config import EngineConfig, ProcessSpec
from dsv4bisect.errors import PatchError
from dsv4bisect.env import HOT, SWITCH_DIR
from dsv4bisect.plugin.hot import HOOK_RECEIPT as HOT_RECEIPT
from dsv4bisect.plugin.receipts import CONTRACT, OK_STATES, load_receipt


@dataclass(frozen=True)
class ReceiptReport:
    """What the receipts say, for the run directory and the report."""

    receipts: int
    states: dict[str, dict[str, str]]  # patch -> "role/rank" -> state
    contract: list[dict[str, Any]] = field(default_factory=list)  # layer rows, one process each
    warnings: list[str] = field(default_factory=list)


def _rank(rec: dict[str, Any]) -> str:
    p = rec.get("process", {})
    return f"tp{p.get('tp_rank')}" + (f"/dp{p['dp_rank']}" if p.get("dp_rank") else "") + \
        (f"/pp{p['pp_rank']}" if p.get("pp_rank") else "")


def read_receipts(directory: Path, since: float | None = None) -> list[dict[str, Any]]:
    """Every receipt in a directory (newest per process and patch), skipping older than since."""
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            rec = load_receipt(path)
        except (ValueError, OSError) as exc:
            raise PatchError(f"unreadable receipt {path}: {exc}",
                             "a receipt is written atomically; is another tool writing there?")
        if since is not None and float(rec.get("written_at", 0)) < since:
            continue
        key = (rec["process"].get("role", "?"), _rank(rec), rec["patch"])
        if key not in latest or rec.get("written_at", 0) >= latest[key].get("written_at", 0):
            latest[key] = rec
    return list(latest.values())


def check_receipts(cfg: EngineConfig, receipts_dir: Path,
                   processes: Iterable[ProcessSpec] | None = None,
                   since: float | None = None) -> ReceiptReport:
    """Raise PatchError unless every requested built-in patch took effect in every scheduler."""
    requested = {p.name: p.variant for p in cfg.patches if p.builtin and p.delivered}
    specs = list(processes if processes is not None else cfg.processes)
    hot = any(SWITCH_DIR in s.env_dict() for s in specs)  # launched for hot switching
    if cfg.kind not in ("sglang", "vllm") or not (requested or hot):
        return ReceiptReport(0, {})
    records = read_receipts(Path(receipts_dir), since)
    by_role: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        by_role[rec["process"].get("role", "unknown")].append(rec)
    states: dict[str, dict[str, str]] = defaultdict(dict)
    problems: list[str] = []
    for spec in specs:
        if spec.gets_patches:
            recs = by_role.get(spec.role, [])
            if SWITCH_DIR in spec.env_dict():
                problems += _check_hot(spec, recs)
                switchable = {HOT_RECEIPT, *(p.partition(":")[0] for p in
                                             spec.env_dict().get(HOT, "").split(",") if p)}
                recs = [r for r in recs if r["patch"] not in switchable - set(requested)]
            problems += _check_role(spec, requested, recs, states, cfg.kind)
    if problems:
        raise PatchError("requested patches did not take effect:\n  " + "\n  ".join(problems),
                         "read the receipts in " + str(receipts_dir) + " and the engine logs; "
                         "a patch that does not take effect would make the trial a silent pass")
    contract = [dict(row, role=r["process"].get("role"), rank=_rank(r))
                for r in records if r["patch"] == CONTRACT
                for row in r.get("detail", {}).get("layers", [])]
    warnings = [f"layer {row['layer_id']} ({row['role']} {row['rank']}): routed_scaling_factor "
                f"applied {row['times_applied']}× ({row['rule']})"
                for row in contract if row.get("exactly_once") is False]
    return ReceiptReport(len(records), {k: dict(v) for k, v in states.items()}, contract, warnings)


def _check_hot(spec: ProcessSpec, recs: list[dict[str, Any]]) -> list[str]:
    """Hot mode: the switch (the flush_cache wrapper) installed in every scheduler, or the
    first switch would only time out (plugin/hot.py writes its `hot-switch` receipt)."""
    mine = [r for r in recs if r["patch"] == HOT_RECEIPT]
    bad = [f"hot switching {r['state']} in {spec.role} {_rank(r)}: {r.get('reason')}"
           for r in mine if r["state"] not in OK_STATES]
    if len({_rank(r) for r in mine}) < spec.schedulers:
        bad.append(f"hot switching: receipts from {len(mine)} of {spec.schedulers} "
                   f"{spec.role} scheduler processes")
    return bad


def _check_role(spec: ProcessSpec, requested: dict[str, str], recs: list[dict[str, Any]],
                states: dict[str, dict[str, str]], kind: str = "sglang") -> list[str]:
    problems = []
    role = spec.role
    unexpected = sorted({r["patch"] for r in recs} - set(requested) - {CONTRACT})
    if unexpected:
        problems.append(f"{role}: receipts for patches that were not requested: "
                        f"{', '.join(unexpected)} (stale DSV4BISECT_PATCHES?)")
    for patch, variant in requested.items():
        mine = [r for r in recs if r["patch"] == patch]
        for r in mine:
            where = f"{role} {_rank(r)}"
            states[patch][f"{role}/{_rank(r)}"] = r["state"]
            if r.get("variant") != variant:
                problems.append(f"{patch}: {where} installed variant {r.get('variant')}, "
                                f"requested {variant}")
            elif r["state"] not in OK_STATES:
                problems.append(f"{patch}: {r['state']} in {where}: {r.get('reason')}")
            elif r["state"] == "installed":
                silent = [t for t in r.get("expects_call", []) if t not in r.get("called", {})]
                if silent:
                    problems.append(f"{patch}: installed in {where} but never called: "
                                    f"{', '.join(silent)} (this deployment does not take the "
                                    f"patched path; see the receipt notes: "
                                    f"{'; '.join(r.get('notes', [])) or 'none'})")
        ranks = {_rank(r) for r in mine}
        if len(ranks) < spec.schedulers:
            where = ("worker processes", "allowed by VLLM_PLUGINS") if kind == "vllm" else \
                ("scheduler processes", "named in SGLANG_PLUGINS")
            problems.append(f"{patch}: receipts from {len(ranks)} of {spec.schedulers} "
                            f"{role} {where[0]}"
                            + (f" (have {', '.join(sorted(ranks))})" if ranks else "")
                            + " — is the dsv4bisect plugin installed in the engine's Python "
                            f"and {where[1]}?")
    return problems
