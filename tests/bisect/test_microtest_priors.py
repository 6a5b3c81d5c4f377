"""Priors from the microtest: the curve, the row -> ratio rule, the neutral cases (pure)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsv4bisect.bisect.microtest_priors import (
    HEAVIEST,
    LIGHTEST,
    Coverage,
    coverage,
    multiplier,
    priors_from_rows,
    ratio,
)
from dsv4bisect.bisect.question import resolve_question
from dsv4bisect.bisect.search.hypotheses import HypothesisSpace, Priors, tier_weights
from dsv4bisect.cli.bisect_priors import (
    candidate_coverage,
    checkpoint_here,
    microtest_patches,
    run_priors,
)
from dsv4bisect.config.resolve import Overrides
from dsv4bisect.microtest.results import Row

ratios = st.one_of(st.floats(min_value=0, max_value=1e9, allow_nan=False),
                   st.just(math.inf), st.just(1.0))


def rel_row(patch: str, value: float, tol: float = 1e-2, *, counted: bool = True,
            case: str = "case") -> Row:
    return Row(patch, (0,), case, "rel_err", value, tol, counted=counted)


@given(ratios)
def test_a_multiplier_is_positive_and_bounded(r: float) -> None:
    m = multiplier(r)
    assert LIGHTEST <= m <= HEAVIEST and m > 0


@given(ratios, ratios)
def test_the_multiplier_is_monotone_in_error_over_tolerance(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert multiplier(lo) <= multiplier(hi)


def test_the_curve_at_its_documented_points() -> None:
    assert multiplier(0) == multiplier(1 / 16) == 0.25  # exact, or far inside: light
    assert multiplier(0.25) == pytest.approx(0.5)  # at the bf16 floor the tolerances sit above
    assert multiplier(1.0) == 1.0  # at the tolerance: no evidence either way
    assert multiplier(1.0 + 1e-9) == pytest.approx(8.0)  # just outside: the FAIL step
    assert multiplier(4) == multiplier(500) == multiplier(math.inf) == 16.0


@given(st.lists(st.tuples(st.sampled_from((1, 2, 3)), ratios), min_size=2, max_size=8))
def test_a_failing_patch_starts_as_the_favourite_whatever_the_tiers(
        cands: list[tuple[int, float]]) -> None:
    names = [f"p{i}" for i in range(len(cands))]
    rows = [rel_row(n, r * 1e-2) for n, (_, r) in zip(names, cands, strict=True)]
    cover = {n: Coverage(True) for n in names}
    priors = priors_from_rows(names, rows, cover)
    weights = priors.apply(tier_weights({n: t for n, (t, _) in zip(names, cands, strict=True)}))
    failing = [n for n, (_, r) in zip(names, cands, strict=True) if r > 1]
    passing = [n for n in names if n not in failing]
    for f in failing:
        assert all(weights[f] > weights[p] for p in passing), (weights, failing)
    # never excluded: every culprit set keeps a positive, finite prior
    space = HypothesisSpace(names, 2, Priors(weights=weights))
    assert np.isfinite(space.log_prior).all()


def test_ratio_reads_min_bounds_as_shortfalls_and_counts_against_zero() -> None:
    overlap = Row("triton-indexer", (2,), "top-32", "overlap", 0.995, 0.99, bound="min")
    assert ratio(overlap) == pytest.approx(0.5)
    short = Row("triton-indexer", (2,), "top-32", "overlap", 0.986, 0.99, bound="min")
    assert ratio(short) == pytest.approx(1.4) and short.status == "FAIL"
    assert ratio(Row("nvfp4-dispatch", (3,), "method map", "mismatch", 0.0, 0.0)) == 0
    assert ratio(Row("nvfp4-dispatch", (3,), "method map", "mismatch", 2.0, 0.0)) == math.inf
    assert ratio(rel_row("mhc-bf16", math.nan)) == math.inf
    with pytest.raises(ValueError):
        ratio(Row("nvfp4-dispatch", (3,), "outputs", "rel_err", 0.2))


def test_the_worst_counted_row_decides_and_the_reason_names_it() -> None:
    rows = [rel_row("mma-decode", 0.002, case="ctx 1024: bf16 partials"),
            rel_row("mma-decode", 0.39, case="ctx 1024: merge †"),
            rel_row("mma-decode", 0.9, counted=False, case="uncounted fault reference"),
            Row("mma-decode", (0,), "informational", "rel_err", 5.0)]
    p = priors_from_rows(["mma-decode"], rows, {"mma-decode": Coverage(True)}).priors[0]
    assert p.ratio == pytest.approx(39) and p.multiplier == 16.0
    assert p.reason.startswith("FAIL at 39x its tolerance (ctx 1024: merge †, layer 0: 0.39")


def test_unmeasured_candidates_stay_neutral_and_say_why() -> None:
    cover = {"a": Coverage(False, "no microtest check: it switches SGLang's own kernel"),
             "b": Coverage(True)}
    priors = priors_from_rows(["a", "b", "c"], [rel_row("a", 1.0)], cover)
    got = {p.name: p for p in priors.priors}
    assert all(got[n].multiplier == 1.0 and got[n].ratio is None for n in "abc")
    assert got["a"].reason == "neutral: no microtest check: it switches SGLang's own kernel"
    assert got["b"].reason == "neutral: no chosen layer or context applies"
    assert priors.apply({"a": 2.0, "d": 0.5}) == {"a": 2.0, "d": 0.5}


def test_coverage_of_sglang_switches_and_custom_patches() -> None:
    assert coverage("mma-decode", "hook", None).measured
    assert coverage("mma-decode", "reference", None).measured
    env = coverage("mma-decode", "env SGLANG_X=1", None)
    assert not env.measured and "measures our op, not the release's" in env.why
    assert not coverage("hash-topk-scaling", "hook", None, unmodelled_runner="auto").measured
    assert "custom patch" in coverage("mine", "hook", None, builtin=False).why
    spec = coverage("nextn-speculation", "args --speculative-algorithm NEXTN", None)
    assert not spec.measured and "how the server decodes" in spec.why


def test_sglang_own_kernels_are_neutral_and_name_the_check_that_models_them() -> None:
    q = resolve_question("dsv4-flash-tp8-latest-all", Overrides())
    cover = candidate_coverage(q, "triton")
    assert not any(c.measured for c in cover.values())
    assert "mma-decode check measures our op" in cover["sm120-flashmla-backend"].why
    assert "triton-indexer check measures our op" in cover["tilelang-indexer"].why
    assert "mhc-bf16 check measures our op" in cover["fused-mhc-post-pre"].why
    assert cover["fp8-wo-a-gemm"].why == "no microtest check: it switches SGLang's own kernel"
    assert microtest_patches(q, cover) == {}
    # nothing to measure: no checkpoint is opened, every candidate neutral with its reason
    priors = run_priors(q, "/nonexistent", "triton")
    assert priors.weights == dict.fromkeys(q.candidates, 1.0)
    assert priors.reasons["sm120-flashmla-backend"].startswith("neutral: SGLang's own kernel")
    checkpoint, why, _ = checkpoint_here(q)
    assert checkpoint is None and "/models/DeepSeek-V4-Flash-NVFP4 is not readable here" in why


def test_the_embedded_question_measures_the_bad_ends_variants() -> None:
    faulty = Overrides(sets=("patches.hash-topk-scaling.variant=double-scale",))
    q = resolve_question("reference-all", faulty)
    cover = candidate_coverage(q, "triton")
    assert all(c.measured for c in cover.values())
    assert microtest_patches(q, cover) == {
        "mhc-bf16": "bf16", "hash-topk-scaling": "double-scale", "mma-decode": "split-k",
        "triton-indexer": "bf16", "nvfp4-dispatch": "hybrid"}
    assert checkpoint_here(q) == ("embedded", "", "triton")
    # nvfp4-dispatch left out of the search stays at its good-end state (off) in every trial,
    # so hash-topk-scaling's contract is checked without it
    q = resolve_question("reference-all", faulty, candidates="hash-topk-scaling,mma-decode")
    assert microtest_patches(q, candidate_coverage(q, "triton")) == {
        "hash-topk-scaling": "double-scale", "mma-decode": "split-k"}
    # a candidate the bad end turns off: nothing of it to measure
    q = resolve_question("reference-all", Overrides(), good="mma-decode", bad="none")
    assert candidate_coverage(q, "triton")["mma-decode"].why.startswith("off at the bad end")
