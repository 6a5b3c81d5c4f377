"""The PD router's own logic (reference/pd/router.py): the answer it builds from the two
servers' and the policies that pick a server; a PD role's patches across a hot switch; and the
router's own HTTP surface, which takes `/flush_cache` by POST only as the servers do."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import requests

from dsv4bisect.reference.pd.router import _merged, _Workers, bootstrap_host, new_room
from dsv4bisect.reference.switch import HotSwitch
from tests.reference.test_server import free_port, stop, wait_healthy


def test_input_logprobs_of_the_prefill_server_come_first() -> None:
    prefill = {"meta_info": {"input_token_logprobs": [[None, 1, None], [-0.5, 2, None]],
                             "input_top_logprobs": [None, [[-0.5, 2, None]]],
                             "output_token_logprobs": [[-0.1, 9, None]]}}
    decode = {"text": "xy", "meta_info": {"input_token_logprobs": [],
                                          "input_top_logprobs": [],
                                          "output_token_logprobs": [[-0.1, 9, None],
                                                                    [-0.2, 8, None]]}}
    merged = _merged(prefill, decode)
    assert merged["meta_info"]["input_token_logprobs"] == [[None, 1, None], [-0.5, 2, None]]
    assert merged["meta_info"]["input_top_logprobs"] == [None, [[-0.5, 2, None]]]
    assert merged["meta_info"]["output_token_logprobs"] == decode["meta_info"][
        "output_token_logprobs"]  # the decode server's own
    assert _merged([prefill], [decode]) == [merged]  # a batch, prompt by prompt


def test_each_policy_picks_as_sglang_routers_does() -> None:
    random.seed(0)
    rr = _Workers(["a", "b", "c"], "round_robin", 0.3)
    assert [rr.pick("x") for _ in range(4)] == [1, 2, 0, 1]
    cache = _Workers(["a", "b"], "cache_aware", 0.3)
    first = cache.pick("the same long system prompt, question one")
    cache.done(first)
    cache.load[1 - first] += 0  # both idle: the shared prefix decides
    assert cache.pick("the same long system prompt, question two") == first
    p2 = _Workers(["a", "b"], "power_of_two", 0.3)
    busy = p2.pick("x")  # one request in flight there
    assert p2.pick("y") == 1 - busy
    solo = _Workers(["a"], "random", 0.3)
    assert {solo.pick(str(i)) for i in range(5)} == {0}
    assert 0 <= new_room() < 2**63 and bootstrap_host("http://[::1]:3") == "[::1]"


def test_a_pd_roles_own_patches_survive_a_hot_switch() -> None:
    switch = HotSwitch.__new__(HotSwitch)
    switch.overlay = "mma-decode:merge-no-rescale,!mhc-bf16"
    got = switch.with_overlay({"mhc-bf16": "bf16", "triton-indexer": "bf16"})
    assert got == {"mma-decode": "merge-no-rescale", "triton-indexer": "bf16"}


@pytest.mark.e2e
@pytest.mark.timeout(120)
def _router() -> tuple[subprocess.Popen[str], str]:
    """A real `dsv4bisect router` whose servers are not up (nothing here needs them)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsv4bisect", "router", "--pd-disaggregation",
         "--prefill", f"http://127.0.0.1:{free_port()}", "none",
         "--decode", f"http://127.0.0.1:{free_port()}", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, timeout=60)
    except BaseException:
        stop(proc)
        raise
    return proc, url


def test_the_router_takes_flush_cache_by_post_only() -> None:
    """A GET, which a web page can send without an Origin, is refused before the router asks
    its servers."""
    proc, url = _router()
    try:
        for method in ("GET", "HEAD"):
            r = requests.request(method, f"{url}/flush_cache", timeout=30)
            assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert "takes POST only" in requests.get(f"{url}/flush_cache", timeout=30).text
        posted = requests.post(f"{url}/flush_cache", timeout=60)  # passed on: no server is up
        assert posted.status_code != 405
    finally:
        stop(proc)


def test_the_router_refuses_a_streamed_chat_with_a_400() -> None:
    """sglang-router's PD mode is answered unstreamed here: a streamed request is a 400 (the
    probe then asks plainly), never the streaming path of a single server, which the router's
    API does not have (it was a 500)."""
    proc, url = _router()
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        r = requests.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert "streaming is not supported by the embedded PD router" in r.text
    finally:
        stop(proc)
