"""ProbeRun directories: round trip, secrets redacted, clear errors on foreign directories."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from dsv4bisect.errors import ConfigError
from dsv4bisect.probe import formats
from dsv4bisect.probe.drift import DriftRecord
from dsv4bisect.probe.grid import Case, Cell
from dsv4bisect.probe.run import ProbeRun, redact
from dsv4bisect.probe.spec import tier_spec
from dsv4bisect.probe.vocab import PROBE_VOCAB


def sample_run() -> ProbeRun:
    content = formats.needle_content(random.Random(0), PROBE_VOCAB, 0.5, distractors=1)
    cell = Cell("needle", 512, 0.5, 2)
    case = Case("needle/L512/d0.5/t2/0", cell, 0, 123, 511,
                ({"role": "user", "content": "x"}, {"role": "user", "content": content.question}),
                511, content.expected, content.values, 0.48, 9, {"pad": 3})
    row = {"case_id": case.case_id, "family": "needle", "cell": cell.key, "arm": "cold",
           "seed": 123, "correct": True, "signatures": [], "output": content.expected}
    drift = DriftRecord("drift/L512/d0.5/t2/0", (0, 5, 6), 1, (1, 2), (-0.5, -0.25),
                        (((5, -0.5), (9, -1.5)), ((6, -0.25),)))
    server = {"model": "m", "info": {"api_key": "sk-123", "max_total_tokens": 9,
                                     "nested": [{"hf_token": "hf_abc", "port": 1}]}}
    return ProbeRun(tier_spec("ci"), "http://127.0.0.1:1", server, (case,), (row,), (drift,),
                    ("a note",), {"total_s": 1.5})


def test_save_load_round_trip(tmp_path: Path) -> None:
    run = sample_run()
    saved = run.save(tmp_path / "base")
    assert saved.path == str(tmp_path / "base")
    loaded = ProbeRun.load(tmp_path / "base")
    assert loaded.cases == run.cases and loaded.rows == run.rows and loaded.drift == run.drift
    assert loaded.spec == run.spec and loaded.notes == run.notes
    text = (tmp_path / "base" / "run.json").read_text()
    assert "sk-123" not in text and "hf_abc" not in text
    assert json.loads(text)["server"]["info"]["max_total_tokens"] == 9
    assert sorted(p.name for p in (tmp_path / "base").iterdir()) == [
        "cases.jsonl", "drift.jsonl", "rows.jsonl", "run.json"]


def test_redact_keeps_ordinary_keys() -> None:
    assert redact({"api_key": "x", "token": "t", "max_new_tokens": 5, "auth": None}) == {
        "api_key": "***", "token": "***", "max_new_tokens": 5, "auth": None}


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a probe run directory"):
        ProbeRun.load(tmp_path)
    (tmp_path / "run.json").write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ProbeRun.load(tmp_path)
    sample_run().save(tmp_path / "r")
    head = json.loads((tmp_path / "r" / "run.json").read_text())
    head["spec"]["seed"] = 99
    (tmp_path / "r" / "run.json").write_text(json.dumps(head))
    with pytest.raises(ConfigError, match="does not match its hash"):
        ProbeRun.load(tmp_path / "r")
