"""Priors from the microtest on the shipped checkpoint: the I/O function and `bisect --plan`.

The microtest runs for real (CPU, the embedded checkpoint, the smoke tier's contexts): a fault
variant the microtest sees starts as the favourite, the rest start light; where the checkpoint is
not readable here the priors are off and the question block says why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bisect.bisect.question import resolve_question
from dsv4bisect.bisect.search.hypotheses import tier_weights
from dsv4bisect.cli.bisect_priors import bisect_priors, probe_lengths
from dsv4bisect.config.resolve import Overrides
from dsv4bisect.probe.spec import tier_spec

pytest.importorskip("torch")


def test_the_split_k_fault_starts_as_the_favourite_on_the_embedded_checkpoint() -> None:
    q = resolve_question("reference-all", Overrides(
        sets=("patches.mma-decode.variant=merge-no-rescale",)))
    assert probe_lengths(q, None) == tier_spec("smoke").lengths == (256, 512, 1024, 2048)
    priors = bisect_priors(q, None, test_cmd=False)
    assert not priors.off and priors.checkpoint == "embedded" and priors.seconds > 0
    print(f"microtest priors on reference-all: {priors.seconds:.1f} s")
    by = {p.name: p for p in priors.priors}
    assert set(by) == set(q.candidates)
    assert by["mma-decode"].multiplier == 16.0 and by["mma-decode"].reason.startswith("FAIL")
    assert all(p.ratio is not None and p.ratio <= 1 and p.multiplier < 1
               for n, p in by.items() if n != "mma-decode")  # all measured, all inside
    weights = priors.apply(tier_weights(q.tiers))
    assert max(weights, key=weights.__getitem__) == "mma-decode"
    assert weights["mma-decode"] > 4 * max(w for n, w in weights.items() if n != "mma-decode")


def test_bisect_plan_prints_the_priors(cli, tmp_path: Path) -> None:
    r = cli("bisect", "reference-all", "--plan", "--set",
            "patches.hash-topk-scaling.variant=double-scale", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("microtest priors (embedded"))
    rows = {line.split()[0]: line.split(maxsplit=3)[1:] for line in lines[head + 1:head + 6]}
    assert set(rows) == {"mhc-bf16", "hash-topk-scaling", "mma-decode", "triton-indexer",
                         "nvfp4-dispatch"}
    weight, mult, reason = rows["hash-topk-scaling"]
    assert (weight, mult) == ("32.00", "x16.00") and reason.startswith("FAIL at 500x")
    assert all(float(w) < 32 and r.startswith("ok") for n, (w, _, r) in rows.items()
               if n != "hash-topk-scaling")
    assert "plan: 5 candidates" in r.stderr and not (tmp_path / "runs").exists()


@pytest.mark.slow  # plans of the standard tier: ~1 min of simulation on 2 cores (issue 42's 400 runs)
def test_priors_are_off_where_they_cannot_or_should_not_run(cli, tmp_path: Path) -> None:
    off = cli("bisect", "reference-all", "--plan", "--no-microtest-priors", cwd=tmp_path)
    assert off.returncode == 0 and "microtest priors: off (--no-microtest-priors)" in off.stderr
    judged = cli("bisect", "reference-all", "--plan", "--test-cmd", "true", cwd=tmp_path)
    assert judged.returncode == 0 and "microtest priors: off (--test-cmd judges" in judged.stderr
    flash = cli("bisect", "dsv4-flash-tp8-all", "--plan", cwd=tmp_path)
    assert flash.returncode == 0, flash.stderr
    assert ("microtest priors: off (the checkpoint /models/DeepSeek-V4-Flash-NVFP4 is not "
            "readable here") in flash.stderr
    forced = cli("bisect", "dsv4-flash-tp8-all", "--plan", "--microtest-priors", cwd=tmp_path)
    lines = forced.stderr.strip().splitlines()
    assert forced.returncode == 5 and lines[-2].startswith("error: --microtest-priors: the "
                                                           "checkpoint")
    assert lines[-1].startswith("hint:") and "Traceback" not in forced.stderr


# three plans and two microtests (~35 s, CI's heaviest fast test at 2026-12-06): the measuring
# path stays fast in test_bisect_plan_prints_the_priors
@pytest.mark.slow
def test_a_second_plan_takes_the_priors_from_the_cache(cli, tmp_path: Path) -> None:
    first = cli("bisect", "reference-all", "--plan", "--json", cwd=tmp_path)
    second = cli("bisect", "reference-all", "--plan", "--json", cwd=tmp_path)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "microtest priors: measuring" in first.stderr
    assert "microtest priors: measuring" not in second.stderr
    assert "microtest priors (embedded, cached, measured 20" in second.stderr
    assert second.stdout == first.stdout  # the same weights, the same plan
    again = cli("bisect", "reference-all", "--plan", "--json", "--no-cache", cwd=tmp_path)
    assert again.returncode == 0 and "microtest priors: measuring" in again.stderr
    assert again.stdout == first.stdout
