"""The trial policy (dsv4bisect/policy.py): one typed value, resolved once from the command line
over the profile, kept in the run's request, and one rule for a drift WARN (`auto`)."""

from __future__ import annotations

import typing

import click
import pytest
import typer

from dsv4bisect.bisect.driver import _Driver, start_bisect
from dsv4bisect.bisect.ledger import Ledger
from dsv4bisect.bisect.setup import BisectRequest, trial_policy
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.trials.runner import TrialResult
from dsv4bisect.cli import build_app
from dsv4bisect.config.schema import BisectSettings
from dsv4bisect.errors import BisectError
from dsv4bisect.policy import DriftRule, Executor, TrialPolicy, WarnAs
from dsv4bisect.probe import verdict as V
from tests.bisect.test_bisect_driver import NOISELESS, OracleRunner

PROFILE = BisectSettings()  # the profile's `bisect` block at its defaults


def test_every_enum_is_the_profiles_and_the_command_lines_words():
    fields = BisectSettings.model_fields
    for field, kind in (("warn_as", WarnAs), ("executor", Executor)):
        assert typing.get_args(fields[field].annotation) == tuple(e.value for e in kind)
    cmd = typer.main.get_command(build_app(["bisect"])).commands["bisect"]  # type: ignore[attr-defined]
    ctx = click.Context(cmd, info_name="bisect")
    shown = {p.name: p.get_help_record(ctx)[0] for p in cmd.params if p.name in
             ("warn_as", "drift", "executor")}
    for name, kind in (("warn_as", WarnAs), ("drift", DriftRule), ("executor", Executor)):
        assert shown[name].endswith("<" + "|".join(e.value for e in kind) + ">")
    (full,) = [p for p in cmd.params if p.name == "full_ends"]
    assert full.opts == ["--full-ends"] and "full_ends" in fields


@pytest.mark.parametrize("asked, policy", [
    # one machine, rounds of 1: hot switching, sequential trials, drift against the ends
    (BisectRequest(), TrialPolicy(WarnAs.AUTO, DriftRule.RELATIVE, True, True, False)),
    (BisectRequest(fresh_launches=True), TrialPolicy(WarnAs.AUTO, DriftRule.ABSOLUTE)),
    (BisectRequest(parallel=2), TrialPolicy(WarnAs.AUTO, DriftRule.ABSOLUTE)),
    (BisectRequest(test_cmd="true"), TrialPolicy(WarnAs.AUTO, DriftRule.ABSOLUTE)),
    # Ray: each node keeps its engines up; idle nodes shard the ends unless --no-shard; the
    # ends in two looks as locally (the nodes share each look's ends and the settled look)
    (BisectRequest(executor=Executor.RAY, parallel=4),
     TrialPolicy(WarnAs.AUTO, DriftRule.RELATIVE, True, True, True, Executor.RAY)),
    (BisectRequest(executor=Executor.RAY, parallel=4, shard=False),
     TrialPolicy(WarnAs.AUTO, DriftRule.RELATIVE, True, True, False, Executor.RAY)),
    (BisectRequest(executor=Executor.RAY, parallel=4, full_ends=True),
     TrialPolicy(WarnAs.AUTO, DriftRule.RELATIVE, True, True, True, Executor.RAY, True)),
    (BisectRequest(warn_as=WarnAs.PASS, drift=DriftRule.ABSOLUTE),
     TrialPolicy(WarnAs.PASS, DriftRule.ABSOLUTE, True, True, False)),
    # the ends in two looks unless --full-ends
    (BisectRequest(full_ends=True),
     TrialPolicy(WarnAs.AUTO, DriftRule.RELATIVE, True, True, False, full_ends=True)),
])
def test_the_policy_is_resolved_from_the_command_line_over_the_profile(asked, policy):
    rounds = asked.parallel if asked.parallel is not None else PROFILE.parallel
    assert trial_policy(asked, PROFILE, rounds) == policy
    assert policy.end_looks is (policy.hot and not policy.full_ends)


def test_the_profile_decides_where_the_command_line_is_silent():
    profile = BisectSettings(warn_as="fail", drift="absolute", executor="ray")
    assert trial_policy(BisectRequest(), profile, 1) == TrialPolicy(
        WarnAs.FAIL, DriftRule.ABSOLUTE, True, True, True, Executor.RAY)
    assert trial_policy(BisectRequest(warn_as=WarnAs.AUTO), profile, 1).warn_as is WarnAs.AUTO
    full = BisectSettings(full_ends=True)
    assert trial_policy(BisectRequest(), full, 1).full_ends
    assert trial_policy(BisectRequest(full_ends=False), full, 1).end_looks


def test_relative_drift_needs_the_sequential_probe_of_a_hot_bisect():
    with pytest.raises(BisectError, match="--drift relative"):
        trial_policy(BisectRequest(drift=DriftRule.RELATIVE, fresh_launches=True), PROFILE, 1)


def test_the_run_file_keeps_the_policy_and_reads_the_flat_keys_before_it():
    policy = TrialPolicy(WarnAs.FAIL, DriftRule.RELATIVE, True, True, True, Executor.RAY)
    assert TrialPolicy.from_json({"policy": policy.to_json()}) == policy
    looks = TrialPolicy(hot=True, sequential=True)
    assert TrialPolicy.from_json({"policy": looks.to_json()}).end_looks
    legacy = {"hot": True, "warn_as": "pass", "drift": "relative", "executor": "ray",
              "shard": True}
    # a run file from before the ends' looks resumes with full ends, as it ran
    assert TrialPolicy.from_json(legacy) == TrialPolicy(WarnAs.PASS, DriftRule.RELATIVE, True,
                                                        True, True, Executor.RAY, True)
    assert TrialPolicy.from_json({}) == TrialPolicy(full_ends=True)
    before = {k: v for k, v in looks.to_json().items() if k != "full_ends"}
    assert not TrialPolicy.from_json({"policy": before}).end_looks


@pytest.mark.parametrize("warn_as, only_drifts, fails", [
    (WarnAs.AUTO, True, True), (WarnAs.AUTO, False, False),
    (WarnAs.FAIL, True, True), (WarnAs.FAIL, False, True),
    (WarnAs.PASS, True, False), (WarnAs.PASS, False, False)])
def test_a_warn_counts_by_one_rule(warn_as, only_drifts, fails):
    assert TrialPolicy(warn_as).warn_fails(bad_end_only_drifts=only_drifts) is fails


def test_auto_reads_the_bad_ends_first_measurement_whatever_the_order(tmp_path):
    """`auto` counts a WARN like the bad end where the bad end's own first measurement only
    drifts; the driver reads it from the ledger, so a driver that decides a WARN trial before
    the bad end (a resume, a round in another order) counts it the same."""
    names = ("a", "b", "c")
    spec = BisectSpec(candidates=names, good={}, bad={n: "on" for n in names}, noise=NOISELESS)
    runner = OracleRunner({"none of them"})  # PASS everywhere but where it is told
    drifts = TrialResult(V.WARN, duration_s=1.0)
    runner.verdicts = {s: [drifts] for s in (frozenset(names), frozenset({"a"}),
                                             frozenset({"a", "b"}), frozenset({"a", "c"}))}
    with Ledger.open(tmp_path / "ledger.sqlite") as ledger:
        out = start_bisect(spec, runner, ledger, tmp_path / "run")
        assert out.result.culprits == {"a"}
        again = _Driver(spec, TrialPolicy(), runner, ledger, out.run_id, tmp_path / "run", None)
        warn_trial = again._slot(9, frozenset({"a"}), 0)
        first = again._decide(warn_trial)  # before the bad end's row is looked at
        again._decide(again._slot(10, frozenset(names), 0))
        assert first is not None and first.outcome == V.FAIL
        assert again._decide(warn_trial) == first
