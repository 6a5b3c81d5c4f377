"""The parts of `dsv4bisect run` that need no engine: ends, spec, A/A subset, the judge on a
partial repeat, the baseline cache, crash verdicts, the report, signals."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.errors import ConfigError, ExitCode
from dsv4bisect.probe.drift import DriftRecord
from dsv4bisect.probe.grid import Case, Cell
from dsv4bisect.probe.null import NULL_ARMS
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import judge
from dsv4bisect.probe.spec import tier_spec
from dsv4bisect.probe.verdict import Verdict
from dsv4bisect.report.run_report import load_run, render_markdown, reproduce_command
from dsv4bisect.run import baseline as cache
from dsv4bisect.run import pipeline
from dsv4bisect.run.arm import Cancelled, Supervisor
from dsv4bisect.run.crash import Crash, cannot_test_verdict, crash_verdict
from dsv4bisect.run.ends import probe_spec, resolve_ends
from dsv4bisect.run.signals import check_interrupt, interrupts, shielded

SMOKE = tier_spec("smoke")
LENGTHS = (256, 512, 1024, 2048)


def _case(family: str, length: int, i: int = 0) -> Case:
    return Case(f"{family}/L{length}/{i}", Cell(family, length, 0.5, 3), i, 1000 + length + i,
                length, ({"role": "user", "content": "x"},), length, "4817293", ("4817293",),
                0.5, 9)


def _row(case: Case, correct: bool) -> dict:
    return {"case_id": case.case_id, "family": case.family, "cell": case.cell.key,
            "length": case.cell.length, "depth": 0.5, "turns": 3, "seed": case.seed,
            "arm": "drift" if case.family == "drift" else "cold", "correct": correct,
            "signatures": [], "prompt_tokens": case.prompt_tokens}


def _run(correct: dict[str, bool] | None = None, spec=SMOKE, cases_per_length: int = 3,
         families=("needle", "copy", "vartrack")) -> ProbeRun:
    cases = [_case(f, n, i) for f in families for n in LENGTHS for i in range(cases_per_length)]
    cases += [_case("drift", n) for n in LENGTHS]
    rows = [_row(c, (correct or {}).get(c.case_id, True)) for c in cases if c.family != "drift"]
    drift = tuple(DriftRecord(c.case_id, (1, 2, 3), 1, (1, 2), (-0.1, -0.2),
                              (((5, -0.1),), ((6, -0.2),))) for c in cases if c.family == "drift")
    return ProbeRun(spec, "http://x", {}, tuple(cases), tuple(rows), drift)


# -- the two ends and the spec -----------------------------------------------------------------
def test_the_good_end_keeps_required_patches_at_their_default_variant() -> None:
    # SGLang 0.5.13 with NVFP4 experts does not start without hash-topk-scaling: it stays on at
    # the good end; the user's patch variant applies to the candidate only, engine keys to both.
    ends = resolve_ends("dsv4-flash-tp8-all", Overrides(sets=(
        "patches.hash-topk-scaling.variant=double-scale", "engine.tp=4")))
    assert ends.good.patch_set == {"hash-topk-scaling": "topk"}
    assert ends.candidate.patch_set["hash-topk-scaling"] == "double-scale"
    assert len(ends.candidate.patch_set) == 6
    for cfg in (ends.good, ends.candidate):
        argv = list(cfg.processes[0].argv)
        assert argv[argv.index("--tp") + 1] == "4"
    assert ends.good_overrides.only == ("hash-topk-scaling",)


def test_the_good_end_of_the_embedded_default_is_all_off() -> None:
    ends = resolve_ends("reference-all", Overrides(enable=(), disable=("mhc-bf16",)))
    assert ends.good.patch_set == {}
    assert "mhc-bf16" not in ends.candidate.patch_set and len(ends.candidate.patch_set) == 5


def test_a_candidate_that_cannot_start_is_bad_input() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_ends("dsv4-flash-tp8", Overrides(disable=("hash-topk-scaling",)))
    assert info.value.exit_code == ExitCode.BAD_INPUT and "cannot start" in info.value.message


def test_probe_spec_takes_the_tier_then_only_the_settings_the_profile_gives() -> None:
    cfg = resolve("reference-all")
    assert probe_spec(cfg) == tier_spec("smoke")  # profile: tier smoke, nothing else set
    assert probe_spec(cfg, "ci") == tier_spec("ci")  # --tier wins; request_timeout_s default
    given = resolve("reference", Overrides(sets=("probe.lengths=[2048]", "probe.warm=true",
                                                 "probe.request_timeout_s=30")))
    spec = probe_spec(given, "ci")
    assert spec.lengths == (2048,) and spec.arms == ("cold", "warm") and spec.timeout_s == 30
    assert spec.families == tier_spec("ci").families


# -- the A/A repeat's subset and the judge -------------------------------------------------------
def test_the_smoke_repeat_covers_every_drift_case_and_the_two_shortest_lengths() -> None:
    base = _run()
    subset, note = cache.repeat_reference(base)
    kept = {(c.family, c.cell.length) for c in subset.cases}
    assert {("drift", n) for n in LENGTHS} <= kept
    assert {n for f, n in kept if f != "drift"} == {256, 512}
    assert note is not None and "18 of 36" in note
    assert subset.drift == base.drift and subset.spec == base.spec
    full, none = cache.repeat_reference(_run(spec=tier_spec("ci")))
    assert none is None and len(full.cases) == len(_run(spec=tier_spec("ci")).cases)


def test_a_partial_repeat_keeps_every_candidate_pair_and_a_sound_floor() -> None:
    base = _run()
    subset, _ = cache.repeat_reference(base)
    repeat = ProbeRun(SMOKE, "http://x", {}, subset.cases, subset.rows, subset.drift)
    # The candidate loses 8 answers at the long lengths, where the repeat did not go.
    lost = [c.case_id for c in base.cases if c.family != "drift" and c.cell.length >= 1024][:8]
    v = judge(base, repeat, _run({cid: False for cid in lost}))
    assert v.verdict == "FAIL" and v.overall["n"] == 36 and v.overall["b"] == 8
    assert v.aa["n"] == 18 and v.aa["flips"] == 0
    assert any("A/A repeat covers 18 of 36" in r for r in v.reasons)
    # A repeat that is unstable on the requests it covered still makes the baseline unusable.
    flipped = {r["case_id"] for r in subset.rows[:9]}
    shaky = ProbeRun(SMOKE, "http://x", {}, subset.cases,
                     tuple({**r, "correct": r["case_id"] not in flipped} for r in subset.rows),
                     subset.drift)
    assert judge(base, shaky, base).verdict == "CANNOT_TEST"


# -- the baseline cache --------------------------------------------------------------------------
def _saved_baseline(root: Path, *, null: bool = True,
                    arms_named: tuple[str, ...] = NULL_ARMS) -> tuple[Path, Path]:
    run = _run()  # a fresh baseline carries its null model's scores (probe/null.py)
    arms = tuple((arm, d) for arm in arms_named for d in run.drift) if null else ()
    base = replace(run, null=arms).save(root / "baseline")
    (root / "baseline" / "logs").mkdir()
    (root / "baseline" / "logs" / "server.log").write_text("engine log\n")
    (root / "baseline" / "config.json").write_text("{}")
    cache.repeat_reference(base)[0].save(root / "baseline-repeat")
    return root / "baseline", root / "baseline-repeat"


def test_the_baseline_cache_round_trips_and_ignores_damaged_entries(tmp_path: Path) -> None:
    key = cache.BaselineKey.of("f" * 16, SMOKE)
    assert cache.lookup(key) == (None, None)
    arm, rep = _saved_baseline(tmp_path / "run1")
    path = cache.store(key, arm, rep)
    assert path == cache.cache_root() / f"{'f' * 16}-{SMOKE.spec_hash()}-b0"
    hit, why = cache.lookup(key)
    assert hit is not None and why is None
    assert ProbeRun.load(path / "baseline").null  # kept with its baseline
    base, repeat = hit.install(tmp_path / "run2" / "baseline", tmp_path / "run2" / "repeat")
    assert base.rows == _run().rows and repeat is not None and len(repeat.rows) == 18
    assert (tmp_path / "run2" / "baseline" / "logs" / "server.log").read_text() == "engine log\n"
    assert not (tmp_path / "run2" / "baseline" / "config.json").exists()  # the run writes its own
    assert cache.lookup(cache.BaselineKey.of("f" * 16, SMOKE.replace(seed_block=1))) == (None, None)
    (path / "baseline" / "rows.jsonl").write_text("{not json\n")
    hit, why = cache.lookup(key)
    assert hit is None and "damaged" in str(why)
    cache.store(key, arm, rep)  # a fresh baseline replaces the damaged entry
    assert cache.lookup(key)[0] is not None


# -- the candidate's two parts ---------------------------------------------------------------
def test_merge_gives_the_rows_a_single_collect_would_in_its_order() -> None:
    base = _run()
    accuracy = ProbeRun(SMOKE, "http://c", {}, base.cases, base.rows, (), ("a",), {"total_s": 2})
    ref = pipeline.drift_reference(base)
    assert ref is not None and {c.family for c in ref.cases} == {"drift"}
    drift_rows = tuple({**_row(c, True), "correct": None} for c in ref.cases)
    drift = ProbeRun(SMOKE, "http://c", {}, ref.cases, drift_rows, base.drift, ("a", "b"),
                     {"total_s": 1})
    merged = pipeline.merge(base, accuracy, drift)
    assert merged.rows == base.rows + drift_rows and merged.drift == base.drift
    assert merged.cases == base.cases and merged.notes == ("a", "b")
    assert merged.timing["total_s"] == 3 and merged.url == "http://c"
    assert pipeline.same_cases(base, merged)
    assert not pipeline.same_cases(base, _run(cases_per_length=2))


# -- verdicts that are not the judge's -------------------------------------------------------
def test_crash_and_cannot_test_verdicts_are_values_with_the_log_tail() -> None:
    crashes = [Crash("candidate", i, "start", "server", 3, "boom\nfatal", "/x/server.log")
               for i in (1, 2)]
    v = crash_verdict(SMOKE, crashes, "the good end ran without crashing")
    assert v.verdict == "FAIL" and v.exit_code == 1 and v.reasons[0].startswith("crash:")
    assert "fatal" in v.reasons[1] and v.signatures["crash"]["attempts"][1]["attempt"] == 2
    assert Verdict.from_dict(json.loads(json.dumps(v.to_dict()))) == v
    c = cannot_test_verdict(SMOKE, "good end", "not ready after 3 s\nlast line", hint="raise it")
    assert c.exit_code == 125 and c.reasons == (
        "cannot test the good end: not ready after 3 s", "log tail:\nlast line", "hint: raise it")


# -- the report -----------------------------------------------------------------------------------
def test_report_renders_an_interrupted_run_and_a_reproducible_command(tmp_path: Path) -> None:
    run = {"schema": "dsv4bisect.run/1", "status": "error", "profile": "my profile.yaml",
           "tier": "smoke", "overrides": {"sets": ["probe.lengths=[256, 512]"], "enable": [],
                                          "disable": ["mhc-bf16"], "only": None},
           "probe": {"tier": "smoke"}, "arms": {}, "exit_code": 5,
           "error": {"message": "requested patches did not take effect", "hint": "check"}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    view = load_run(tmp_path)
    md = render_markdown(view)
    assert "# dsv4bisect run: ERROR" in md and "did not take effect" in md
    assert reproduce_command(run) == ("dsv4bisect run 'my profile.yaml' --tier smoke --set "
                                      "'probe.lengths=[256, 512]' --disable mhc-bf16")
    with pytest.raises(ConfigError):
        load_run(tmp_path / "nothing")


# -- engines and signals -------------------------------------------------------------------------
def test_no_engine_is_spawned_after_stop_all(tmp_path: Path) -> None:
    from dsv4bisect.engines.launcher import Launch

    profile = tmp_path / "p.yaml"
    profile.write_text("schema_version: 1\nname: p\nengine:\n  kind: command\n  command:\n"
                       f"    argv: [{sys.executable!r}, -c, 'import time; time.sleep(60)']\n")
    sup = Supervisor()
    sup.stop_all()
    launch = Launch(resolve(str(profile)), tmp_path / "run")
    with pytest.raises(Cancelled):
        sup.spawn(launch)
    assert launch.procs == []


def test_interrupts_are_remembered_and_teardown_is_shielded() -> None:
    with interrupts():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs by now at the latest
            raise AssertionError("SIGTERM did not interrupt")
        except KeyboardInterrupt:
            pass  # swallowed, as CPython does when it lands inside a __del__
        with pytest.raises(KeyboardInterrupt):
            check_interrupt()  # the run's next waiting point raises it again
        with shielded():
            os.kill(os.getpid(), signal.SIGINT)  # ignored during teardown
            time.sleep(0.2)
    check_interrupt()  # cleared when the run ends
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_run_and_report_import_without_torch_or_matplotlib() -> None:
    import subprocess

    code = ("import sys, dsv4bisect.cli.run, dsv4bisect.cli.report, dsv4bisect.run.session\n"
            "bad = [m for m in ('torch', 'triton', 'numpy', 'matplotlib') if m in sys.modules]\n"
            "assert not bad, bad\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr


def test_a_cached_baseline_without_its_null_model_is_measured_again(tmp_path: Path) -> None:
    key = cache.BaselineKey.of("e" * 16, SMOKE)
    cache.store(key, *_saved_baseline(tmp_path / "run1", null=False))
    hit, why = cache.lookup(key)
    assert hit is None and why is not None and "no null model" in why


def test_a_cached_baseline_with_an_older_null_model_is_measured_again(tmp_path: Path) -> None:
    # `drift-warm` compared only the positions after each split: a baseline cached with it
    # would judge every later candidate against the null that under-covered re-chunking.
    key = cache.BaselineKey.of("d" * 16, SMOKE)
    cache.store(key, *_saved_baseline(tmp_path / "run1",
                                      arms_named=("drift-concurrent", "drift-warm")))
    hit, why = cache.lookup(key)
    assert hit is None and why is not None and "drift-warm" in why and "measured again" in why
    cache.store(key, *_saved_baseline(tmp_path / "run2"))
    hit, why = cache.lookup(key)  # the same key with the current arms is a hit
    assert hit is not None and why is None
