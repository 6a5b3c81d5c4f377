"""`bisect PROFILE --upgrade-from OLD`: the switch defaults that changed between two releases,
from the shipped switch catalogs (patching/switch_data)."""

from __future__ import annotations

import pytest

from dsv4bisect.bisect.question import patch_overrides
from dsv4bisect.bisect.setting_candidates import ABSENT
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.bisect.upgrade import code_bisect_hint, upgrade_differences, upgrade_question
from dsv4bisect.config.resolve import resolve
from dsv4bisect.errors import BisectError
from dsv4bisect.patching.switch_catalog import load_catalog


def test_candidates_are_the_changed_defaults_and_the_new_switches_on() -> None:
    new, arch, diffs = upgrade_differences("dsv4-flash-tp8-latest", "0.5.21")
    assert (new, arch) == ("0.5.23", "sm120")
    by_name = {d.name: d for d in diffs}
    old, cur = load_catalog("0.5.21"), load_catalog("0.5.23")
    for d in diffs:
        if d.left_out is None:
            switch = cur.by_name(d.name.split(":", 1)[1])
            before = old.get(switch.name)
            if before is None:  # new: on by default, its good end off
                assert switch.default_for("sm120") is True and d.good == "0"
            else:
                assert before.default_for("sm120") != switch.default_for("sm120")
            assert d.bad == ABSENT  # the bad end leaves it to the new release's default
    # every switch whose default changed is there, each with a reason when left out
    changed = {s.name for s in cur.switches if old.get(s.name) is not None
               and old.get(s.name).default_for("sm120") != s.default_for("sm120")}
    assert {n.split(":", 1)[1] for n in by_name} >= changed
    assert "AMD/NPU" in by_name["env:SGLANG_HIP_MHC_BOUNDARY_WIDE_TILE"].left_out
    assert "not an on/off switch" in by_name["env:SGLANG_DSV4_FP8_DECODE_SPLIT_CTX"].left_out


def test_the_good_end_sets_the_old_defaults_and_the_bad_end_is_the_profile() -> None:
    q = upgrade_question("dsv4-flash-tp8-latest", "0.5.21")
    assert q.upgrade == ("0.5.21", "0.5.23") and q.candidates
    spec = BisectSpec(candidates=q.candidates, good=q.good, bad=q.bad)
    good = resolve(q.profile, patch_overrides(spec.patches_for(frozenset())))
    bad = resolve(q.profile, patch_overrides(spec.patches_for(frozenset(q.candidates))))
    env = good.process("server").env_dict()
    for name in q.candidates:
        assert env[name.split(":", 1)[1]] == q.good[name]
    assert bad.process("server") == resolve("dsv4-flash-tp8-latest").process("server")


def test_an_upgrade_needs_an_older_release_of_an_sglang_profile() -> None:
    with pytest.raises(BisectError):
        upgrade_question("dsv4-flash-tp8-latest", "0.5.23")
    with pytest.raises(BisectError):
        upgrade_question("reference", "0.5.21")


def test_the_code_regression_hint_probes_commits_against_the_old_baseline() -> None:
    hint = code_bisect_hint("P", "0.5.21", "0.5.23")
    assert "git bisect start v0.5.23 v0.5.21" in hint
    assert "dsv4bisect probe URL --baseline" in hint


def test_every_switch_is_priced_as_a_launch_as_the_runner_runs_it() -> None:
    """The switch file carries patches only (bisect/trials/hot_runner.py drops settings from
    it), so every env setting, even one the release reads at every call, is load-time in the
    plan (docs/sglang.md, "Switch discovery")."""
    q = upgrade_question("dsv4-flash-tp8-latest", "0.5.21")
    catalog = load_catalog("0.5.23")
    per_call = [n for n in q.candidates if catalog.by_name(n.split(":", 1)[1]).read == "call"]
    assert per_call  # the question has switches read per call
    assert set(q.candidates) <= set(q.load_time)


def test_another_vendors_switch_is_dropped_by_where_it_is_read() -> None:
    """Issue 41, item 9: the filter matched names only, so SGLANG_DSV4_FP4_LOGITS_BUDGET_MB
    (read only in fp4_indexer_hip.py) stayed a candidate on sm120 at 600 s a launch. Every site
    the catalog lists decides now, and the left-out line says where it is read."""
    _, arch, diffs = upgrade_differences("dsv4-flash-tp8-latest", "0.5.21")
    why = {d.name: d.left_out for d in diffs}
    assert arch == "sm120"
    assert why["env:SGLANG_DSV4_FP4_LOGITS_BUDGET_MB"] == (
        "read only in AMD/NPU code (fp4_indexer_hip.py): not read on sm120")
    assert why["env:SGLANG_HACK_FLASHMLA_BACKEND"] == (  # `is_hip() and envs.X.get() == ...`
        "read only behind an AMD/NPU platform test (unified_kv_gate.py:15): not read on sm120")
    q = upgrade_question("dsv4-flash-tp8-latest", "0.5.21")
    assert "env:SGLANG_DSV4_FP4_LOGITS_BUDGET_MB" not in q.candidates
    assert dict(q.left_out)["env:SGLANG_DSV4_FP4_LOGITS_BUDGET_MB"].startswith("read only in")


def test_a_switch_read_on_the_nvidia_path_stays_whatever_its_name() -> None:
    from dsv4bisect.bisect.switch_info import other_vendor
    from dsv4bisect.patching.switch_catalog import Switch

    def switch(name: str, *sites: str, behind: tuple[str, ...] = ()) -> Switch:
        return Switch(name=name, kind="env", type="bool", default=False, read="call",
                      hot=False, gates="f", where=sites[0], tier="kernel", also=sites[1:],
                      other_vendor=behind)

    shared = "sglang/srt/models/deepseek_v4.py:10"
    hip_file = "sglang/srt/models/deepseek_common/amd/deepseek_v4_hip.py:5"
    assert other_vendor("SGLANG_HIP_X", "sm120", switch("SGLANG_HIP_X", shared)) is None
    assert other_vendor("SGLANG_X", "sm120", switch("SGLANG_X", hip_file, shared)) is None
    assert other_vendor("SGLANG_X", "sm120", switch("SGLANG_X", hip_file, shared,
                                                    behind=(shared,))) == (
        "read only in AMD/NPU code (deepseek_v4_hip.py) and behind an AMD/NPU platform test "
        "(deepseek_v4.py:10): not read on sm120")
    assert other_vendor("SGLANG_X", "hip", switch("SGLANG_X", hip_file)) is None  # on AMD
    assert other_vendor("SGLANG_ROCM_Y", "sm120") is not None  # no catalog entry: the name
