"""`dsv4bisect doctor` and the preflight on a vLLM profile, on this machine (no vLLM, no GPU):
what was checked (the release's shipped facts: argv, every hook target, the call sites, the
plugin's entry point in this Python), what could not be (said in `warn` rows), and a release
outside the verified list refused in one line with a hint."""

from __future__ import annotations

import json
import sys


def test_doctor_says_what_it_checked_and_what_it_could_not(cli) -> None:
    got = cli("doctor", "dsv4-flash-vllm-tp8-latest-all", "--python", sys.executable, "--json")
    assert got.returncode == 1  # no checkpoint and no GPUs here
    rows = {r["name"]: r for r in json.loads(got.stdout)}
    assert rows["vLLM installed"]["status"] == "warn"  # the shipped facts stand in
    assert rows["vLLM"]["status"] == "ok" and "0.34.0" in rows["vLLM"]["detail"]
    assert rows["plugin"]["status"] == "ok" and "dsv4bisect.plugin.vllm:main" in \
        rows["plugin"]["detail"]
    assert rows["vllm serve argv"]["status"] == "ok"
    targets = {n: r for n, r in rows.items() if n.startswith(("mhc-bf16:", "mma-decode:",
                                                               "nvfp4-dispatch:", "(plugin):"))}
    assert len(targets) >= 9 and all(r["status"] == "ok" for r in targets.values()), targets
    assert rows["mma-decode: call flash_mla_with_kvcache"]["status"] == "ok"
    assert rows["hook numerics vs vLLM's own kernels"]["status"] == "warn"
    assert rows["call evidence"]["status"] == "warn"
    assert rows["preflight: model"]["status"] == "fail"


def test_an_older_release_is_refused_in_one_line(cli) -> None:
    got = cli("doctor", "dsv4-flash-vllm-tp8", "--python", sys.executable, "--set",
              "engine.vllm_version=0.19.0")
    assert got.returncode == 1
    assert "error: vLLM 0.19.0 predates DeepSeek-V4 support" in got.stderr
    assert "hint: upgrade vLLM to a verified release" in got.stderr


def test_the_preflight_stops_a_run_before_any_launch(cli, tmp_path) -> None:
    got = cli("run", "dsv4-flash-vllm-tp8", "--set", f"engine.python={sys.executable}",
              cwd=tmp_path)
    assert got.returncode == 5, got.stderr
    assert got.stderr.startswith("error: preflight: vLLM is not installed in "), got.stderr
    assert "\nhint: " in got.stderr and not (tmp_path / "runs").exists()
