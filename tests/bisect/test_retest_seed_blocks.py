"""Issue 31: a bisect's re-tests at seed blocks 0–3 on the `smoke` tier run on the embedded
engine (block 2 used to be CANNOT_TEST: a 3-turn copy conversation did not fit in 256
tokens), and a trial that cannot test records its own seed block in `verdict.json`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4bisect.bisect.question import resolve_question
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.hot_runner import HOT_POLICY as HOT
from dsv4bisect.bisect.trials.node_runner import RunnerRequest, node_runner
from dsv4bisect.cli.options import overrides

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_the_good_end_at_seed_blocks_0_to_3_on_the_smoke_tier(tmp_path: Path) -> None:
    q = resolve_question("reference-all", overrides(None, None, None, ["engine.precision=exact"]),
                         None, None, "hash-topk-scaling")
    spec = BisectSpec(candidates=q.candidates, good=q.good, bad=q.bad)
    runner = node_runner(RunnerRequest(q.profile, q.good, tuple(q.sets), "smoke", False,
                                       bad=spec.patches_for(frozenset(q.candidates)),
                                       load_time=tuple(q.load_time), policy=HOT))
    good = spec.patches_for(frozenset())
    verdicts = {}
    try:
        for block in range(4):  # the good end's check at each block: baseline and A/A repeat
            trial_dir = tmp_path / f"t{block}"
            trial_dir.mkdir()
            result = runner.run(good, block, trial_dir)
            verdicts[block] = (result.verdict,
                               json.loads((trial_dir / "verdict.json").read_text()))
        # A spec whose turns cannot fit its lengths: the trial stops with CANNOT_TEST, and its
        # verdict names the block it was asked at, not block 0.
        runner.spec = runner.spec.replace(turns=(64,))
        trial_dir = tmp_path / "t-unfit"
        trial_dir.mkdir()
        unfit = runner.run(good, 5, trial_dir)
        unfit_doc = json.loads((trial_dir / "verdict.json").read_text())
    finally:
        runner.close()
        runner.stop_all()
    for block, (verdict, doc) in verdicts.items():
        assert verdict != "CANNOT_TEST", (block, doc["reasons"])
        assert doc["probe"]["seed_block"] == block and doc["probe"]["tier"] == "smoke"
    assert unfit.verdict == "CANNOT_TEST"
    assert "does not fit" in unfit_doc["reasons"][0]
    assert unfit_doc["probe"]["seed_block"] == 5
