"""PD disaggregation end to end: `reference-pd` launched as a deployment is (prefill server,
decode server, router: three processes, each loading the engine), probed over HTTP against the
monolithic `reference`.

- at `precision: exact` the PD set answers every probe request as the one server does;
- the Mooncake `state-not-sent` fault (sglang PR #24878) FAILs the smoke probe;
- the `stale-slot` fault, which starts once every slot of the decode server's state pool was
  used, is caught with the probe's polluting phase and not without it; the pool's size and the
  phase's length both come from `decode_pool_size` (SGLang's decode pool sizing), not from the
  probe.

Slow: four model processes on a shared 2-core CPU take minutes (docs/performance.md, "PD
disaggregation")."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.engines.launcher import Launch
from dsv4bisect.probe.runner import collect, judge
from dsv4bisect.probe.spec import tier_spec
from dsv4bisect.reference.pd.slots import decode_pool_size

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]

EXACT = "engine.precision=exact"


@contextmanager
def launched(tmp: Path, profile: str, *sets: str) -> Iterator[str]:
    with Launch(resolve(profile, Overrides(sets=sets)), tmp) as launch:
        yield launch.url


def _outputs(run) -> dict:
    return {(r["case_id"], r["arm"], r["concurrency"]): r["output"] for r in run.rows}


def test_reference_pd_answers_as_the_monolithic_reference(tmp_path) -> None:
    spec = tier_spec("ci")
    with launched(tmp_path / "mono", "reference", EXACT) as mono, \
            launched(tmp_path / "pd", "reference-pd", EXACT) as pd:
        base = collect(mono, spec)
        cand = collect(pd, spec, reference_run=base)
    assert _outputs(cand) == _outputs(base) and len(base.rows) >= 4
    for a, b in zip(base.drift, cand.drift, strict=True):  # teacher-forced: bit for bit
        assert a.token_logprobs == b.token_logprobs
    assert judge(base, base, cand).verdict == "PASS"


def test_the_mooncake_state_fault_fails_the_smoke_probe(tmp_path, cli) -> None:
    with launched(tmp_path / "mono", "reference") as mono, \
            launched(tmp_path / "pd", "reference-pd",
                     "engine.pd.transfer_fault=state-not-sent") as pd:
        done = cli("probe", pd, "--baseline", mono, "--out", tmp_path / "probe", timeout=3000)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL" in done.stderr


def test_a_fault_that_starts_late_is_caught_with_the_polluting_phase_only(tmp_path) -> None:
    """The decode server runs 32 requests at once: its pool holds decode_pool_size(32) = 96
    slots, more than the candidate's probe sends, so without the phase no slot is reused; with a
    phase of that many requests every measured request lands in a reused slot. Each arm on
    freshly launched servers."""
    running = 32
    slots = decode_pool_size(running)
    spec = tier_spec("smoke").replace(families=("needle",))
    verdicts = {}
    for warmup in (0, slots):
        where = tmp_path / f"warmup-{warmup}"
        probe = spec.replace(warmup_requests=warmup)
        with launched(where / "mono", "reference") as mono, \
                launched(where / "pd", "reference-pd", "engine.pd.transfer_fault=stale-slot",
                         f"engine.pd.decode.args=[--max-running-requests, '{running}']") as pd:
            base = collect(mono, probe)
            cand = collect(pd, probe, reference_run=base)
            decode = requests.get(pd + "/server_info", timeout=60).json()["decode"][0]
        assert decode["state_pool_slots"] == slots
        if not warmup:  # the probe alone never reuses a slot
            assert decode["state_pool_allocations"] < slots
        verdicts[warmup] = judge(base, base, cand)
    assert verdicts[0].verdict == "PASS", verdicts[0].reasons
    assert verdicts[slots].verdict == "FAIL", verdicts[slots].reasons
    assert any(f"polluting phase of {slots} requests" in r for r in verdicts[slots].reasons)
