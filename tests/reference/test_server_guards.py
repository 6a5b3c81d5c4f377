"""The embedded server's guards of issue 40, against a real `dsv4bisect serve` process (the
random tiny model): a request whose log-probs would cost a gigabyte is a 400 before any model
work, requests in flight share one budget of log-prob entries (503 beyond), and a
state-changing route takes POST only (a CSRF guard) — over SGLang's API, streamed or not, and
over vLLM's (`serve --api vllm`)."""

from __future__ import annotations

import concurrent.futures
import random
import time
from collections.abc import Iterator

import pytest
import requests

from dsv4bisect.reference.response_bound import MAX_ENTRIES_PER_REQUEST
from tests.reference.test_server import _serving

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

VOCAB = 512  # the random tiny model's


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from _serving(None, "--max-model-len", "4096")  # the last --max-model-len wins


@pytest.fixture(scope="module")
def vllm_url() -> Iterator[str]:
    yield from _serving(None, "--max-model-len", "4096", "--api", "vllm")


def prompt(n: int, seed: int = 0) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(3, 250) for _ in range(n)]


def scored(url: str, n: int, top: int, seed: int = 0) -> requests.Response:
    return requests.post(f"{url}/generate", timeout=600, json={
        "input_ids": prompt(n, seed), "return_logprob": True, "logprob_start_len": 0,
        "top_logprobs_num": top, "sampling_params": {"max_new_tokens": 1}})


def test_a_reply_of_a_million_log_prob_entries_is_refused_up_front(url: str) -> None:
    r = scored(url, 2100, 512)  # 2099 positions + 1 token, × 513 entries: 1.08 M
    assert r.status_code == 400 and len(r.content) < 2000
    message = r.json()["message"]
    assert f"at most {MAX_ENTRIES_PER_REQUEST}" in message and "top_logprobs_num" in message
    chat = requests.post(f"{url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000,
        "logprobs": True, "top_logprobs": 300})  # 4000 output tokens × 301
    assert chat.status_code == 400, chat.text
    ok = scored(url, 300, 20)  # what the probe asks: answered
    assert ok.status_code == 200
    assert len(ok.json()["meta_info"]["input_top_logprobs"][1]) == 20


@pytest.mark.slow
def test_requests_in_flight_share_one_budget_of_log_prob_entries(url: str) -> None:
    """Five requests of 0.9 M entries each at once: four fit the server's budget, the fifth is
    a 503 at once; once they are answered, the next is served."""
    top = MAX_ENTRIES_PER_REQUEST // 2000 - 1  # 2000 positions: 0.9-1.0 M entries each
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        replies = list(pool.map(lambda s: scored(url, 2000, top, seed=s), range(5)))
    codes = sorted(r.status_code for r in replies)
    assert codes == [200, 200, 200, 200, 503], [r.text[:200] for r in replies]
    busy = next(r for r in replies if r.status_code == 503)
    assert "log-prob entries" in busy.json()["message"]
    assert scored(url, 2000, top, seed=9).status_code == 200


def test_flush_cache_takes_post_only(url: str) -> None:
    for method in ("GET", "HEAD"):
        r = requests.request(method, f"{url}/flush_cache", timeout=60)
        assert r.status_code == 405 and r.headers["allow"] == "POST"
    r = requests.get(f"{url}/flush_cache", timeout=60)
    assert "takes POST only" in r.json()["message"]
    assert requests.post(f"{url}/flush_cache", timeout=60).status_code == 200
    foreign = requests.post(f"{url}/flush_cache", headers={"Origin": "http://evil.example"},
                            timeout=60)
    assert foreign.status_code == 403


def test_a_streamed_request_is_bounded_and_holds_its_entries_until_it_ends(url: str) -> None:
    """The bound before the first event (a JSON 400, as SGLang validates before its 200), and
    a stream's entries count against those in flight until its last event was made: four
    streams of a whole request's entries each fill the budget, a fifth request is 503 while
    they run and served once they are gone."""
    body = {"input_ids": prompt(2100), "return_logprob": True, "logprob_start_len": 0,
            "top_logprobs_num": 512, "stream": True, "sampling_params": {"max_new_tokens": 1}}
    big = requests.post(f"{url}/generate", json=body, timeout=60)
    assert big.status_code == 400 and big.headers["content-type"] == "application/json"
    assert f"at most {MAX_ENTRIES_PER_REQUEST}" in big.json()["message"]
    # output tokens only: 4088 × (1 + 255) = 1 046 528 entries, within one request's bound
    long = {"input_ids": prompt(8), "return_logprob": True, "top_logprobs_num": 255,
            "stream": True, "sampling_params": {"max_new_tokens": 4088, "ignore_eos": True}}
    sessions = [requests.Session() for _ in range(4)]
    streams = [s.post(f"{url}/generate", json=long, stream=True, timeout=120) for s in sessions]
    try:
        for r in streams:
            assert r.status_code == 200 and next(r.iter_lines()).startswith(b"data:")
        busy = scored(url, 1000, 20)  # 21 000 entries, over the 8 192 the four streams left
        assert busy.status_code == 503 and "log-prob entries" in busy.json()["message"]
    finally:
        for r, s in zip(streams, sessions):
            r.close()  # the client hangs up: the server cancels the stream, gives its entries
            s.close()
    for _ in range(120):
        if (again := scored(url, 1000, 20)).status_code == 200:
            break
        time.sleep(0.5)
    assert again.status_code == 200, again.text


def test_vllms_api_is_bounded_and_resets_its_cache_by_post_only(vllm_url: str) -> None:
    r = requests.post(f"{vllm_url}/v1/completions", timeout=60, json={
        "prompt": prompt(2100), "prompt_logprobs": -1, "max_tokens": 1})  # 2100 × 513 entries
    assert r.status_code == 400 and set(r.json()) == {"error"}  # vLLM's error body
    assert f"at most {MAX_ENTRIES_PER_REQUEST}" in r.json()["error"]["message"]
    ok = requests.post(f"{vllm_url}/v1/completions", timeout=300, json={
        "prompt": prompt(300), "prompt_logprobs": 20, "max_tokens": 1})
    assert ok.status_code == 200 and len(ok.json()["choices"][0]["prompt_logprobs"]) == 300
    for method in ("GET", "HEAD"):
        refused = requests.request(method, f"{vllm_url}/reset_prefix_cache", timeout=60)
        assert refused.status_code == 405 and refused.headers["allow"] == "POST"
    assert "takes POST only" in requests.get(f"{vllm_url}/reset_prefix_cache",
                                             timeout=60).text
    assert requests.post(f"{vllm_url}/reset_prefix_cache", timeout=60).status_code == 200
    assert requests.get(f"{vllm_url}/flush_cache", timeout=60).status_code == 404  # not vLLM's
