"""A probe run: the cases, one row per request, drift records; saved as a directory.

Directory layout (`ProbeRun.save(dir)`, read back by `ProbeRun.load(dir)`):

    run.json      spec, spec hash, probe version, server facts (secrets redacted), notes, timing
    cases.jsonl   the exact conversations (so a candidate gets byte-identical requests)
    rows.jsonl    one row per request: case id, family, cell, seed, arm, prompt_tokens,
                  expected, output, correct, first_wrong_char, signatures, latency, ...
    drift.jsonl   teacher-forced scores per drift transcript (token ids, logprobs, top-k)
    null.jsonl    a baseline's drift transcripts scored again under harmless changes (the null
                  model's arms, `probe/null.py`): each record with its `arm`
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dsv4bisect.base.atomic import write_text
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.drift import DriftRecord
from dsv4bisect.probe.grid import Case
from dsv4bisect.probe.spec import PROBE_VERSION, ProbeSpec

RUN_SCHEMA = "dsv4bisect.probe-run/1"


RowKey = tuple[str, str, int]


def row_key(row: dict[str, Any]) -> RowKey:
    """The same request in two runs: same case, same arm, same concurrency level (a row
    written before levels existed ran at 1)."""
    return row["case_id"], row["arm"], int(row.get("concurrency", 1))


def redact(data: Any) -> Any:
    """Copy of nested data with every secret hidden (the one policy: dsv4bisect/redact.py)."""
    from dsv4bisect.redact import redact as redact_data

    return redact_data(data)


@dataclass(frozen=True)
class ProbeRun:
    """Everything one probe of one server produced."""

    spec: ProbeSpec
    url: str
    server: dict[str, Any]  # model, max_model_len, compress_ratios, info (redacted)
    cases: tuple[Case, ...]
    rows: tuple[dict[str, Any], ...]
    drift: tuple[DriftRecord, ...] = ()
    notes: tuple[str, ...] = ()
    timing: dict[str, float] = field(default_factory=dict)
    path: str | None = None  # set by save() and load()
    # per concurrency level ("1", "16"): requests, tokens, wall_s, requests_per_s, tokens_per_s
    throughput: dict[str, Any] = field(default_factory=dict)
    # (arm, record): the null model's scores of the drift transcripts (a fresh baseline only)
    null: tuple[tuple[str, DriftRecord], ...] = ()
    # a shard of a probe split across replicas: {"index", "count"}; a merge of every shard:
    # {"count", "parts": [per shard: index, url, started_at, timing, rows]} (probe/shards.py)
    shard: dict[str, Any] | None = None

    def rows_by_key(self) -> dict[RowKey, dict[str, Any]]:
        """Rows keyed by (case_id, arm, concurrency): the pairing key across runs."""
        return {row_key(r): r for r in self.rows}

    def drift_by_case(self) -> dict[str, DriftRecord]:
        return {d.case_id: d for d in self.drift}

    def case(self, case_id: str) -> Case:
        for c in self.cases:
            if c.case_id == case_id:
                return c
        raise KeyError(case_id)

    def save(self, directory: str | os.PathLike[str]) -> ProbeRun:
        """Write the run directory (atomically per file); returns the run with `path` set."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        head = {"schema": RUN_SCHEMA, "probe_version": PROBE_VERSION,
                "spec_hash": self.spec.spec_hash(), "seed_block": self.spec.seed_block,
                "spec": self.spec.to_dict(), "url": self.url,
                "server": redact(self.server), "notes": list(self.notes), "timing": self.timing,
                "throughput": self.throughput, **({"shard": self.shard} if self.shard else {}),
                "counts": {"cases": len(self.cases), "rows": len(self.rows),
                           "drift": len(self.drift), "null": len(self.null)}}
        _write(out / "run.json", json.dumps(head, indent=2) + "\n")
        _write(out / "cases.jsonl", _jsonl(c.to_dict() for c in self.cases))
        _write(out / "rows.jsonl", _jsonl(self.rows))
        _write(out / "drift.jsonl", _jsonl(d.to_dict() for d in self.drift))
        if self.null:  # a fresh baseline's (the others have none)
            _write(out / "null.jsonl", _jsonl({"arm": arm, **d.to_dict()}
                                              for arm, d in self.null))
        return replace(self, path=str(out))

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ProbeRun:
        """Read a directory written by `save`; a missing or foreign directory is a ConfigError."""
        from dsv4bisect.base.bounded import json_object, load_json

        src = Path(directory)
        hint = "pass a directory written by `dsv4bisect probe --out`"
        if not (src / "run.json").is_file():
            raise ConfigError(f"`{src}` is not a probe run directory (no run.json)", hint)
        head = json_object(load_json(src / "run.json", "run"), str(src / "run.json"),
                           "a probe run record", hint)
        if head.get("schema") != RUN_SCHEMA:
            raise ConfigError(f"`{src}` holds a {str(head.get('schema'))[:40]!r} run, expected "
                              f"{RUN_SCHEMA}", hint)
        try:
            spec = ProbeSpec.from_dict(head["spec"])
            if spec.spec_hash() != head.get("spec_hash"):
                raise ConfigError(f"`{src}`: the saved spec does not match its hash",
                                  "the run directory was edited or written by another version")
            return cls(spec, head["url"], head.get("server", {}),
                       tuple(Case.from_dict(d) for d in _read_jsonl(src / "cases.jsonl")),
                       tuple(_read_jsonl(src / "rows.jsonl")),
                       tuple(DriftRecord.from_dict(d) for d in _read_jsonl(src / "drift.jsonl")),
                       tuple(head.get("notes", [])), head.get("timing", {}), str(src),
                       dict(head.get("throughput") or {}),
                       tuple((str(d["arm"]), DriftRecord.from_dict(d))
                             for d in _read_jsonl(src / "null.jsonl")),
                       head.get("shard") or None)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            # A field missing or of the wrong type: the files were edited, not our bug.
            raise ConfigError(f"`{src}`: a probe record of the wrong shape "
                              f"({type(exc).__name__}: {str(exc)[:60]})",
                              "the probe run directory was edited or truncated") from None


def _jsonl(items: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps(i, separators=(",", ":")) + "\n" for i in items)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    from dsv4bisect.base.bounded import load_jsonl

    if not path.exists():
        return []
    rows = load_jsonl(path)
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        raise ConfigError(f"`{path}`: record {bad + 1} is not a JSON object",
                          "the probe run directory was edited or truncated")
    return rows


def _write(path: Path, text: str) -> None:
    write_text(path, text)
