"""The log-prob entries a request may make the server hold (issue 40, item 3), as the HTTP layer
counts them: per request (400 beyond) and across the requests in flight (503 beyond), given back
when a request ends however it ends. Torch-free; the real server's refusal is
test_server_guards.py."""

from __future__ import annotations

import threading

import pytest

from dsv4bisect.reference import response_bound as rb
from dsv4bisect.reference.request_body import ApiError

PER = rb.MAX_ENTRIES_PER_REQUEST


def test_the_field_request_is_refused_with_what_to_lower() -> None:
    # 16 k prompt positions scored with top_logprobs_num 512: the 249 MB reply of the field
    entries = rb.logprob_entries(scored_positions=16_000, output_tokens=1, k=512)
    with rb.request_scope(), pytest.raises(ApiError) as err:
        rb.charge(entries)
    assert err.value.status == 400
    assert "top_logprobs_num" in err.value.message and str(PER) in err.value.message
    assert rb.IN_FLIGHT.entries == 0


def test_the_probes_largest_request_fits() -> None:
    # a whole 32 k context at top-k 20, the most a probe spec asks of the embedded engine
    with rb.request_scope():
        rb.charge(rb.logprob_entries(scored_positions=32_767, output_tokens=0, k=20))
        assert rb.IN_FLIGHT.entries == 32_767 * 21
    assert rb.IN_FLIGHT.entries == 0


def test_a_batched_request_counts_all_its_prompts() -> None:
    with rb.request_scope(), pytest.raises(ApiError) as err:
        for _ in range(3):
            rb.charge(PER // 2)
    assert err.value.status == 400
    assert rb.IN_FLIGHT.entries == 0  # what the first prompts took is given back too


def test_requests_in_flight_share_one_budget_and_give_it_back() -> None:
    held, release, refusals = threading.Barrier(6), threading.Event(), []

    def client() -> None:
        try:
            with rb.request_scope():
                rb.charge(PER)
                held.wait(10)
                release.wait(10)
        except ApiError as exc:
            refusals.append(exc.status)
            held.wait(10)

    threads = [threading.Thread(target=client) for _ in range(5)]
    for t in threads:
        t.start()
    held.wait(10)  # every client has charged or been refused
    assert refusals == [503] and rb.IN_FLIGHT.entries == rb.MAX_ENTRIES_IN_FLIGHT
    release.set()
    for t in threads:
        t.join(10)
    assert rb.IN_FLIGHT.entries == 0
    with rb.request_scope():  # and the next one gets in
        rb.charge(PER)


def test_work_outside_a_request_meets_only_the_per_request_bound() -> None:
    rb.charge(PER)  # e.g. a hot switch's warm-up: nothing is held
    assert rb.IN_FLIGHT.entries == 0
    with pytest.raises(ApiError):
        rb.charge(PER + 1)
