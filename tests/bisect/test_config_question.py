"""`bisect --good-config A --bad-config B`: every difference a candidate, trials built from A.

The ten-setting pair of docs/results/2026-12-02-cpu-diffbisect (four patches, three hot, one
the merge fault; a re-chunking chunk size, a request cap, the radix cache, two env variables,
a server flag; a startup timeout that cannot matter) is the fixture.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dsv4bisect.bisect.config_question import config_question, differences, load_end
from dsv4bisect.bisect.question import patch_overrides
from dsv4bisect.bisect.setting_candidates import ABSENT
from dsv4bisect.bisect.spec import BisectSpec
from dsv4bisect.config.embedded_switches import embedded_catalog
from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.errors import BisectError

RESULTS = Path(__file__).resolve().parents[2] / "docs/results/2026-12-02-cpu-diffbisect"
SETTINGS = ("engine.chunked_prefill_size", "engine.max_running_requests",
            "engine.disable_radix_cache", "env:OMP_NUM_THREADS", "env:MALLOC_ARENA_MAX",
            "arg:--header-timeout")
PATCHES = ("hash-topk-scaling", "mma-decode", "triton-indexer", "nvfp4-dispatch")


@pytest.fixture
def pair(tmp_path: Path) -> tuple[str, str]:
    for name in ("embedded-good.yaml", "embedded-bad.yaml"):
        shutil.copy(RESULTS / name, tmp_path / name)
    return str(tmp_path / "embedded-good.yaml"), str(tmp_path / "embedded-bad.yaml")


def test_every_difference_is_a_candidate_and_the_timeout_is_left_out(pair: tuple[str, str]
                                                                       ) -> None:
    q = config_question(*pair)
    assert set(q.candidates) == {*PATCHES, *SETTINGS}
    assert dict(q.left_out) == {"engine.startup_timeout_s": "how long the launcher waits"}
    assert q.bad["mma-decode"] == "merge-no-rescale" and "mma-decode" not in q.good
    assert q.good["env:OMP_NUM_THREADS"] == ABSENT and q.bad["env:OMP_NUM_THREADS"] == "2"
    assert q.bad["arg:--header-timeout"] == "30" and q.bad["triton-indexer"] == "fp32"
    # load-time: every setting and nvfp4-dispatch (its patch says so); hot: the other patches
    assert set(q.load_time) == {*SETTINGS, "nvfp4-dispatch"}
    # the prior follows the switch tier: scheduling settings weigh less than a kernel patch
    assert q.setting_weights["engine.chunked_prefill_size"] < 1.0
    assert q.tier_names["engine.chunked_prefill_size"].startswith("scheduling")


def test_the_search_builds_b_from_a(pair: tuple[str, str]) -> None:
    """Every candidate at B's value, on A's profile, launches exactly B's server (argv and
    env), and none of them launches A's."""
    q = config_question(*pair)
    spec = BisectSpec(candidates=q.candidates, good=q.good, bad=q.bad)
    a, b = resolve(pair[0]), resolve(pair[1])
    built_bad = resolve(q.profile, patch_overrides(spec.patches_for(frozenset(q.candidates))))
    built_good = resolve(q.profile, patch_overrides(spec.patches_for(frozenset())))
    assert built_bad.process("server").argv == b.process("server").argv
    assert built_bad.process("server").env == b.process("server").env
    assert built_good.process("server") == a.process("server")
    one = resolve(q.profile, patch_overrides(spec.patches_for(frozenset({"arg:--header-timeout"}))))
    assert one.process("server").argv == (*a.process("server").argv, "--header-timeout", "30")


def test_a_removed_setting_is_removed(pair: tuple[str, str]) -> None:
    """B -> A: settings B states and A does not are switched by removing them."""
    q = config_question(pair[1], pair[0])
    spec = BisectSpec(candidates=q.candidates, good=q.good, bad=q.bad)
    built = resolve(q.profile, patch_overrides(spec.patches_for(frozenset(q.candidates))))
    a = resolve(pair[0])
    assert built.process("server").argv == a.process("server").argv
    assert "OMP_NUM_THREADS" not in built.process("server").env_dict()


def test_two_releases_point_at_upgrade_from() -> None:
    with pytest.raises(BisectError) as err:
        config_question("dsv4-flash-tp8", "dsv4-flash-tp8-latest")
    assert "--upgrade-from 0.5.13" in err.value.hint


def test_sglang_pair_is_the_upstream_switches() -> None:
    q = config_question("dsv4-flash-tp8-latest", "dsv4-flash-tp8-latest-all")
    assert "fp8-wo-a-gemm" in q.candidates and "tilelang-indexer" in q.candidates
    assert "triton-indexer" in dict(q.left_out)  # masked by tilelang-indexer: inert


def test_quiet_differences_are_left_out(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(
        "schema_version: 1\nname: b\nextends: reference\nengine:\n  port: 31000\n"
        "  env: {SGLANG_LOG_LEVEL: debug, HF_TOKEN: x}\n  args: [--log-level, debug]\n")
    with pytest.raises(BisectError) as err:
        config_question("reference", str(tmp_path / "b.yaml"))
    for name in ("engine.port", "env:SGLANG_LOG_LEVEL", "env:HF_TOKEN", "arg:--log-level"):
        assert name in err.value.hint


def test_a_run_directory_is_its_profile_and_overrides(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text('{"profile": "reference", "overrides": {"sets": '
                                  '["engine.chunked_prefill_size=1024"], "only": ["mhc-bf16"]}}')
    ref, loaded, sets = load_end(str(run))
    assert ref == "reference" and sets == ("engine.chunked_prefill_size=1024",)
    other = load_end("reference")[1]
    names = {d.name for d in differences(other, loaded, "reference", ref)}
    assert names == {"mhc-bf16", "engine.chunked_prefill_size"}


def test_embedded_catalog_is_read_from_the_launcher() -> None:
    catalog = {s.name: s for s in embedded_catalog()}
    assert catalog["engine.chunked_prefill_size"].gates == "--chunk-size"
    assert catalog["engine.precision"].tier == "precision"
    assert catalog["mma-decode"].hot and not catalog["engine.moe_backend"].hot
    assert "engine.tp" not in catalog and "engine.sglang_version" not in catalog  # SGLang's
    assert "engine.port" not in catalog  # cannot matter


def test_args_override_replaces_a_flag() -> None:
    base = resolve("reference", Overrides(args=(("--header-timeout", "5"),)))
    again = resolve("reference", Overrides(sets=("engine.args=[--header-timeout, '5']",),
                                           args=(("--header-timeout", "7"),)))
    assert base.process("server").argv[-2:] == ("--header-timeout", "5")
    assert again.process("server").argv.count("--header-timeout") == 1
    assert again.process("server").argv[-1] == "7"
    gone = resolve("reference", Overrides(sets=("engine.args=[--header-timeout, '5']",),
                                          args=(("--header-timeout", None),)))
    assert "--header-timeout" not in gone.process("server").argv


def test_diff_config_ends_with_the_bisect_command(cli, pair: tuple[str, str]) -> None:
    out = cli("diff-config", *pair)
    assert out.returncode == 1
    assert f"dsv4bisect bisect --good-config {pair[0]} --bad-config {pair[1]}" in \
        out.stdout.replace("\n", "")
    up = cli("diff-config", "dsv4-flash-tp8", "dsv4-flash-tp8-latest")
    assert "dsv4bisect bisect dsv4-flash-tp8-latest --upgrade-from 0.5.13" in up.stdout


def test_bisect_refuses_two_releases_with_the_upgrade_command(cli, tmp_path: Path) -> None:
    r = cli("bisect", "--good-config", "dsv4-flash-tp8", "--bad-config",
            "dsv4-flash-tp8-latest", "--plan", cwd=tmp_path)
    assert r.returncode == 5
    assert "hint: bisect the upgrade: dsv4bisect bisect dsv4-flash-tp8-latest --upgrade-from " \
        "0.5.13" in r.stderr
    lone = cli("bisect", "--good-config", "dsv4-flash-tp8", "--plan", cwd=tmp_path)
    assert lone.returncode == 5 and "go together" in lone.stderr


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(3000)
def test_ten_settings_bisect_names_the_merge_fault(cli, pair: tuple[str, str],
                                                   tmp_path: Path) -> None:
    """The issue's end-to-end case, with default options: two embedded configurations that
    differ in ten settings (three hot patches, one the merge fault; seven load-time, one
    re-chunking) — the bisect names mma-decode in one round (docs/results/
    2026-12-02-cpu-diffbisect has the recorded run)."""
    r = cli("bisect", "--good-config", pair[0], "--bad-config", pair[1], "--json", "--out",
            tmp_path / "runs", cwd=tmp_path, timeout=2900)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["culprits"] == ["mma-decode"], report["culprits"]
    assert "candidates (10)" in r.stderr
    assert "left out: engine.startup_timeout_s" in r.stderr


def test_switches_of_a_reference_profile_are_the_embedded_catalog(cli, tmp_path: Path) -> None:
    r = cli("switches", "reference", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    names = {s["name"]: s for s in doc["switches"]}
    assert doc["release"] == "embedded"
    assert names["engine.chunked_prefill_size"]["gates"] == "--chunk-size"
    assert names["mma-decode"]["hot"] is True
