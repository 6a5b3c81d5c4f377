"""`dsv4bisect serve --speculative-algorithm NEXTN` on the embedded checkpoint at
`precision: exact`: the same greedy answers as without speculation on 16 probe conversations
(needle and copy), with the acceptance and forwards per token it reports; and its refusals."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
import requests

from dsv4bisect.reference.chat import apply_chat_template
from dsv4bisect.reference.training.eval import probe_cases
from tests.reference.test_server import free_port, serve_argv, stop, wait_healthy

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3600)]


def _serve(*extra: str) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(serve_argv("--port", str(port), "--device", "cpu", "--checkpoint",
                                       "embedded", "--precision", "exact", *extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, timeout=600)
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def answers() -> dict[str, tuple[list[list[int]], dict]]:
    prompts = [apply_chat_template(list(c.messages), True)
               for c in probe_cases((512, 1024), 1)[:16]]
    out = {}
    for name, extra in (("plain", ()), ("spec", ("--speculative-algorithm", "NEXTN"))):
        for url in _serve(*extra):
            ids = [requests.post(f"{url}/generate", json={
                "input_ids": p, "sampling_params": {"max_new_tokens": 96, "temperature": 0}},
                timeout=1200).json()["output_ids"] for p in prompts]
            out[name] = (ids, requests.get(f"{url}/server_info", timeout=30).json())
    return out


def test_speculative_greedy_answers_equal_plain_ones(answers) -> None:
    assert answers["spec"][0] == answers["plain"][0]


def test_speculation_reports_sglangs_metrics(answers) -> None:
    plain, spec = answers["plain"][1], answers["spec"][1]
    assert plain["speculative_algorithm"] is None and plain["spec_accept_rate"] is None
    assert plain["main_forwards_per_output_token"] == 1.0
    assert (spec["speculative_algorithm"], spec["speculative_num_steps"],
            spec["speculative_eagle_topk"], spec["speculative_num_draft_tokens"]) == (
        "NEXTN", 3, 1, 4)
    # issue 32's bars; the MTP layer trained on chained drafts measured 0.47 forwards per token
    # and an acceptance of 0.64 on these 16 (docs/performance.md; 0.38 when trained at depth 1)
    assert spec["main_forwards_per_output_token"] <= 0.7
    assert 0.6 <= spec["spec_accept_rate"] <= 1 and spec["avg_spec_accept_length"] > 1


@pytest.mark.parametrize(("args", "words"), [
    (("--speculative-algorithm", "NEXTN", "--speculative-eagle-topk", "2"), "tree verification"),
    (("--speculative-num-steps", "2"), "without --speculative-algorithm"),
])
def test_bad_speculative_arguments_exit_5_with_a_hint(args, words) -> None:
    done = subprocess.run(serve_argv("--port", "0", *args), capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 5
    assert "error: " in done.stderr and words in done.stderr and "hint: " in done.stderr
