"""The hot runner on the embedded engine: an engine is launched in the configuration of the
first trial that needs its load-time state, so that trial is a fresh launch's (its details say
`fresh_launch`) and the driver may take it as the culprits' fresh confirmation; the next trial
of the same load-time state is switched in that engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bisect.bisect.question import resolve_question
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.hot_runner import HOT_POLICY as HOT
from dsv4bisect.bisect.trials.node_runner import RunnerRequest, node_runner
from dsv4bisect.cli.options import overrides

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


# two launches and four ci-tier probes: about 25 s on the 2-core CPU
def test_a_new_load_time_state_launches_in_the_trial_configuration(tmp_path: Path) -> None:
    # nvfp4-dispatch is decided at load on the embedded engine; hash-topk-scaling at call time
    q = resolve_question("reference-all", overrides(None, None, None, ["engine.precision=exact"]),
                         None, None, "nvfp4-dispatch,hash-topk-scaling")
    assert tuple(q.load_time) == ("nvfp4-dispatch",)
    spec = BisectSpec(candidates=q.candidates, good=q.good, bad=q.bad)
    runner = node_runner(RunnerRequest(q.profile, q.good, tuple(q.sets), "ci", False,
                                       bad=spec.patches_for(frozenset(q.candidates)),
                                       load_time=tuple(q.load_time), policy=HOT))
    trials = tmp_path / "trials"

    def run(subset: set[str], n: int) -> dict:
        trial_dir = trials / f"t{n}"
        trial_dir.mkdir(parents=True)
        return runner.run(spec.patches_for(frozenset(subset)), 0, trial_dir).details

    try:
        good = run(set(), 0)  # launches the good end, measures its baseline and A/A
        alone = run({"nvfp4-dispatch"}, 1)  # λ = {nvfp4}: not up, launched in this set
        both = run({"nvfp4-dispatch", "hash-topk-scaling"}, 2)  # same λ: switched
    finally:
        runner.close()
        runner.stop_all()
    assert good["fresh_launch"] and good["launched_as"] == spec.patches_for(frozenset())
    assert alone["fresh_launch"] and alone["switch_s"] == 0
    assert alone["launched_as"] == spec.patches_for(frozenset({"nvfp4-dispatch"}))
    assert not both["fresh_launch"] and both["launch_s"] == 0 and both["switch_s"] > 0
    assert both["launched_as"] == alone["launched_as"]
    assert runner.launches == 2
