"""The ends' two looks end to end on the embedded engine (docs/bisect.md, "Ends that stop when
their question is answered"): a hot bisect on the smoke tier whose bad end loses facts at
look 1 settles its ends there (fewer requests than the full tier's) and still names the
culprit; bad ends that only WARN at look 1 (drift, facts not established) and one that passes
at look 1 probe both ends again at the full tier (the latter before it says BAD-END-PASSES)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from dsv4bisect.bisect.end_looks import LOOK1_MAX_SHARE, look_spec
from dsv4bisect.probe import grid
from dsv4bisect.probe.layout import calibrate
from dsv4bisect.probe.spec import tier_spec
from dsv4bisect.probe.tasks import tasks_of
from dsv4bisect.probe.vocab import PROBE_VOCAB
from dsv4bisect.reference.chat import apply_chat_template

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3000)]


def _requests(spec) -> int:
    """The requests one probe of `spec` sends (the count does not depend on the tokenizer)."""
    def count(messages: list[dict[str, str]]) -> int:
        return len(apply_chat_template(messages))

    cases = grid.build_cases(spec, PROBE_VOCAB, count, calibrate(count, PROBE_VOCAB), (4, 16))
    return len(tasks_of(spec, cases))


def _trials(runs: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(runs / "ledger.sqlite") as conn:
        conn.row_factory = sqlite3.Row
        rows = list(conn.execute("SELECT * FROM trials WHERE status = 'done' ORDER BY id"))
    return [{**dict(r), "details": json.loads(r["details"] or "{}"),
             "patches": json.loads(r["patches"])} for r in rows]


def _bad_end(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The bad end's trial at seed block 0 (a re-test of the bad end, at block 1, has looks of
    its own)."""
    (bad,) = [t for t in trials if "end_look" in t["details"] and t["seed_block"] == 0]
    return bad


def test_a_bad_end_that_loses_facts_settles_at_look_1(cli, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    r = cli("bisect", "reference-all", "--tier", "smoke",
            "--set", "patches.fp8-wo-a-gemm.variant=scale-layout", "--json", "--out", runs,
            cwd=tmp_path, timeout=2900)
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(r.stdout)
    assert report["status"] == "found" and report["culprits"] == ["fp8-wo-a-gemm"], report
    bad = _bad_end(_trials(runs))
    smoke = tier_spec("smoke")
    assert bad["verdict"] == "FAIL"
    assert bad["details"]["end_look"] == 1
    assert bad["details"]["settled_by"] in ("accuracy", "signatures", "other")
    assert bad["details"]["requests"] == _requests(look_spec(smoke, 1)) < _requests(smoke)
    run_dir = Path(report["run_dir"])
    ends = run_dir / "ends" / "b0"
    assert json.loads((ends / "settled.json").read_text())["look"] == 1
    assert (ends / "look1" / "bad" / "run.json").is_file() and not (ends / "look2").exists()
    # the trials replay the cases of look 1: their spec is look 1's
    saved = json.loads((ends / "look1" / "bad" / "run.json").read_text())
    assert saved["spec"]["case_share"] == LOOK1_MAX_SHARE


@pytest.mark.parametrize("variant, culprit", [
    # look 1 lost 4 of 36 answers, none gained (p = 0.06), and drifted: not established
    ("patches.mma-decode.variant=swa-ring-stale", "mma-decode"),
    # look 1 drifted and showed none of the draft's truncations (they are in other cases)
    ("patches.nextn-speculation.variant=draft-eos", "nextn-speculation"),
])
def test_a_look_1_that_only_warns_goes_to_the_full_tier_and_finds_the_fact_loser(
        cli, tmp_path: Path, variant: str, culprit: str) -> None:
    runs = tmp_path / "runs"
    r = cli("bisect", "reference-all", "--tier", "smoke", "--set", variant, "--json",
            "--out", runs, cwd=tmp_path, timeout=2900)
    assert r.returncode == 0, r.stderr[-4000:]
    report = json.loads(r.stdout)
    assert report["status"] == "found" and report["culprits"] == [culprit], report
    bad = _bad_end(_trials(runs))
    # a WARN at look 1 is no proof that the bad end only drifts: the full tier decides, and
    # there the bad end FAILs on facts (not a bisect on drift that names what drifts most)
    assert bad["details"]["end_look"] == 2 and bad["details"]["settled_by"] is None
    assert bad["verdict"] == "FAIL"
    assert json.loads((Path(report["run_dir"]) / "ends" / "b0" / "settled.json").read_text()
                      ) == {"look": 2, "settled_by": None}


def test_a_bad_end_that_passes_at_look_1_is_probed_at_the_full_tier(cli, tmp_path: Path
                                                                     ) -> None:
    runs = tmp_path / "runs"
    # trtllm-clamp acts only under flashinfer_trtllm MoE: the embedded engine computes the same.
    # Each re-test of a passing bad end pays both looks (~8 min here under load): a lower
    # confidence asks fewer of them (at 0.95, four blocks: 35 min).
    r = cli("bisect", "reference", "--tier", "smoke", "--only", "trtllm-clamp",
            "--candidates", "trtllm-clamp", "--confidence", "0.8", "--json", "--out", runs,
            cwd=tmp_path, timeout=2900)
    report = json.loads(r.stdout)
    assert report["status"] == "bad-end-passes", report.get("headline")
    bad = _bad_end(_trials(runs))
    assert bad["verdict"] == "PASS"
    assert bad["details"]["end_look"] == 2 and bad["details"]["settled_by"] is None
    smoke = tier_spec("smoke")
    # look 1's bad end, then the rest of the full tier's good-end pair (or a cache hit) and
    # bad end: look 1's requests are not sent again but complete the look-2 runs
    look1, full = _requests(look_spec(smoke, 1)), _requests(smoke)
    assert bad["details"]["requests"] >= full
    ends = Path(report["run_dir"]) / "ends" / "b0"
    look2_bad = json.loads((ends / "look2" / "bad" / "run.json").read_text())
    assert any(n.startswith(f"look: {look1} of {full} requests") for n in look2_bad["notes"])
    assert json.loads((ends / "settled.json").read_text()) == {"look": 2, "settled_by": None}
    for look in ("look1", "look2"):
        assert (ends / look / "baseline" / "run.json").is_file()
    assert (ends / "look2" / "bad" / "run.json").is_file()
    assert Path(bad["trial_dir"], "candidate-look1", "run.json").is_file()
