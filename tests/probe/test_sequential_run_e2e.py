"""The sequential trial probe against the embedded engine's real HTTP server (ci tier, random
tiny weights): the good end, its A/A repeat and a bad end (the NVFP4 double-scaling fault) are
probed at full size; a trial on the good engine is then decided "like good" and one on the
faulty engine "like bad", by drift (random weights retrieve nothing, so the ends differ only by
drift), with every request replayed from the baseline and the rows saved as a probe run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import collect
from dsv4bisect.probe.sequential_run import run_sequential
from dsv4bisect.probe.spec import tier_spec
from tests.probe.test_e2e_embedded import start_embedded

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

SPEC = tier_spec("ci")
FAULT = "hash-topk-scaling:double-scale"


@pytest.fixture(scope="module")
def good_url() -> Iterator[str]:
    yield from start_embedded("")


@pytest.fixture(scope="module")
def bad_url() -> Iterator[str]:
    yield from start_embedded(FAULT)


@pytest.fixture(scope="module")
def ends(good_url: str, bad_url: str) -> tuple[ProbeRun, ProbeRun, ProbeRun]:
    base = collect(good_url, SPEC)
    rep = collect(good_url, SPEC, reference_run=base)
    bad = collect(bad_url, SPEC, reference_run=base)
    return base, rep, bad


def test_trial_like_the_good_end_passes(ends: tuple[ProbeRun, ProbeRun, ProbeRun],
                                        good_url: str, tmp_path: Path) -> None:
    base, rep, bad = ends
    result = run_sequential(good_url, base, bad, rep, false_fail=0.05, false_pass=0.05)
    d = result.decision
    assert result.verdict == "PASS" and d.decided_by == "drift", d.reasons
    assert d.requests == d.drift_requests == len(base.drift) and d.accuracy_requests == 0
    assert (d.false_fail, d.false_pass) == (0.05, 0.05)
    saved = result.save(tmp_path / "trial")
    back = ProbeRun.load(tmp_path / "trial")
    assert len(back.rows) == d.requests and back.spec == base.spec
    assert all(r["kl_mean"] == 0.0 for r in back.rows if r["family"] == "drift")
    doc = json.loads((tmp_path / "trial" / "sequential.json").read_text())
    assert doc["verdict"] == "PASS" and doc["requests"] == d.requests
    assert doc == saved.to_json()


def test_trial_like_the_bad_end_fails(ends: tuple[ProbeRun, ProbeRun, ProbeRun],
                                      bad_url: str) -> None:
    base, rep, bad = ends
    result = run_sequential(bad_url, base, bad, rep, false_fail=0.05, false_pass=0.05)
    assert result.verdict == "FAIL" and result.decision.decided_by == "drift"
    # drift alone never FAILs (issue 26): the ends differ only by drift, so the trial's drift
    # WARN, as large as the bad end's, decides it like the bad end
    assert "the ends differ only by drift" in result.decision.reasons[0]
    assert "of the bad end's" in result.decision.reasons[0]
    assert result.decision.requests <= len(base.drift) + len(base.rows)
