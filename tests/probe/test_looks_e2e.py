"""A later look completed from an earlier one (probe/looks.py), on the embedded engine's real
HTTP server (`--precision exact`, so a request's answer does not depend on its batch mates): the
full tier probed as look 1 and then only the cases look 1 did not keep, extended by look 1's
requests, is the one-probe run of the full tier in every row but timing; and the full tier's run
restricted to look 1's cases (`restrict`, how a bisect serves a `run`'s cached full-tier baseline
as its look-1 good end) is look 1's own run, which the rest extends back to the full one."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from dsv4bisect.bisect.end_looks import look_spec
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.looks import earlier_cases, extend, restrict
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import collect, judge
from dsv4bisect.probe.shards import same_content
from dsv4bisect.probe.spec import tier_spec
from tests.probe.test_e2e_embedded import start_embedded

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# the smoke tier's serving conditions (cold, warm at 16, hit) on its shortest length only:
# three cases per (family, length) stratum, look 1 keeps one of each
FULL = tier_spec("smoke").replace(lengths=(256,))
LOOK1 = look_spec(FULL, 1)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    yield from start_embedded("", "--precision", "exact")


@pytest.fixture(scope="module")
def runs(server: str) -> tuple[ProbeRun, ProbeRun, ProbeRun]:
    whole = collect(server, FULL)
    look1 = collect(server, LOOK1)
    rest = collect(server, FULL, skip=earlier_cases(look1))
    return whole, look1, rest


def test_look_two_sends_only_the_rest_and_extends_to_the_one_probe_run(runs) -> None:
    whole, look1, rest = runs
    assert 0 < len(look1.rows) < len(whole.rows)
    # no request of a look-1 case is sent again, the drift transcripts included
    assert not {r["case_id"] for r in rest.rows} & earlier_cases(look1)
    assert len(rest.rows) + len(look1.rows) == len(whole.rows) and rest.drift == ()
    merged = extend(look1, rest)
    assert same_content(merged, whole) == ["notes"]  # a note more: what came from look 1
    (note,) = set(merged.notes) - set(whole.notes)
    assert note.startswith(f"look: {len(look1.rows)} of {len(whole.rows)} requests")
    assert [d.to_dict() for d in merged.drift] == [d.to_dict() for d in whole.drift]
    assert len(merged.null) == len(whole.null) > 0  # the null model is look 1's, whole
    verdict = judge(whole, None, merged)
    assert verdict.verdict == "PASS" and verdict.overall.get("discordant", 0) == 0


def test_a_look_of_other_cases_or_requests_twice_is_refused(runs, server: str) -> None:
    whole, look1, rest = runs
    with pytest.raises(ConfigError, match="both looks"):
        extend(look1, whole)  # every look-1 request is in the later run too
    other = collect(server, LOOK1.replace(seed_block=1))
    with pytest.raises(ConfigError, match="seed block"):
        extend(other, rest)


def test_the_full_run_restricted_to_look_one_is_look_ones_run(runs) -> None:
    whole, look1, rest = runs
    cut = restrict(whole, LOOK1)
    assert cut.spec == LOOK1 and same_content(cut, look1) == ["notes"]  # the note says whence
    assert [d.to_dict() for d in cut.drift] == [d.to_dict() for d in look1.drift]
    assert len(cut.null) == len(whole.null) > 0  # drift transcripts are always kept
    # the inverse of `extend`: the rest of the full tier completes the cut to the full run
    assert same_content(extend(cut, rest), whole) == ["notes"]
    assert judge(look1, None, cut).overall.get("discordant", 0) == 0


def test_a_run_of_another_block_or_without_a_kept_case_is_not_restricted(runs, server) -> None:
    whole, look1, rest = runs
    with pytest.raises(ConfigError, match="seed block"):
        restrict(whole, LOOK1.replace(seed_block=1))
    with pytest.raises(ConfigError, match="lacks request"):
        restrict(rest, LOOK1)  # the rest holds no request of look 1's accuracy cases
    with pytest.raises(ConfigError, match="another probe spec"):
        restrict(whole, LOOK1.replace(lengths=(512,)))
    # an A/A repeat covers a subset of the cases: restricted, it keeps the kept ones it has
    gone = next(c.case_id for c in look1.cases if c.family != "drift")
    some = replace(whole, cases=tuple(c for c in whole.cases if c.case_id != gone),
                   rows=tuple(r for r in whole.rows if r["case_id"] != gone))
    with pytest.raises(ConfigError, match="lacks case"):
        restrict(some, LOOK1)
    partial = restrict(some, LOOK1, whole=False)
    assert {c.case_id for c in partial.cases} == {c.case_id for c in look1.cases} - {gone}
    # a kept case whose request is missing is refused either way
    row = next(r for r in whole.rows if r["case_id"] in {c.case_id for c in look1.cases})
    with pytest.raises(ConfigError, match="lacks request"):
        restrict(replace(whole, rows=tuple(r for r in whole.rows if r is not row)), LOOK1,
                 whole=False)
