"""What the probe's requests leave the engine to compute, against the embedded engine's real
server (probe/computed.py, the costs --plan prices): per arm, the scheduler's
`prefill_tokens_computed` over the probe's own request (`runner.chat_row`) is the model's
count, and the row's `cached_tokens` says the same."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dsv4bisect.probe.client import ProbeClient
from dsv4bisect.probe.computed import request_computed, row_computed
from dsv4bisect.probe.runner import _build, chat_row
from dsv4bisect.probe.spec import tier_spec

from tests.probe.test_e2e_embedded import start_embedded

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

SPEC = tier_spec("smoke")  # its three arms; multi-turn cases (3 turns)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from start_embedded("")


def _computed(client: ProbeClient) -> int:
    return int(client.describe().info["prefill_tokens_computed"])


def test_each_arm_computes_what_the_plan_prices(url: str) -> None:
    client = ProbeClient(url, timeout_s=600)
    cases = [c for c in _build(client, SPEC, client.describe(), [], None)
             if c.family != "drift" and c.cell.length in (256, 1024)]
    picked = [next(c for c in cases if c.family == f and c.cell.length == n)
              for f in ("needle", "copy") for n in (256, 1024)]
    for case in picked:
        for arm in ("cold", "hit", "warm"):  # the hit right after its cold request, as at level 1
            if arm == "warm":
                client.flush_cache()  # a level starts flushed
            before = _computed(client)
            row = chat_row(client, SPEC, case, arm)
            spent = _computed(client) - before
            # the embedded engine recomputes nothing of a whole hit (SGLang: one token a send)
            assert spent == request_computed(arm, case.prompt_tokens, recomputed=0), (case, arm)
            assert row["prompt_tokens"] == case.prompt_tokens
            if arm == "cold":
                assert row["cached_tokens"] == 0 and row_computed(row) == spent
            elif arm == "hit":  # the whole prompt found cached, both sends
                assert row["cached_tokens"] == case.prompt_tokens and row_computed(row) == spent
            else:  # the replay computed every turn but the last; the scored request the last
                assert 0 < row["cached_tokens"] < case.prompt_tokens
                assert row_computed(row) == spent == case.prompt_tokens
