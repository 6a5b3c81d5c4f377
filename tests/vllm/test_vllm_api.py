"""The embedded engine behind vLLM's API (`serve --api vllm`), probed by the probe's own client:
vLLM's shapes and error bodies, the same numbers as the SGLang API on the same checkpoint, and
vLLM's cache semantics (a prompt-logprobs request does not read the prefix cache;
/reset_prefix_cache empties it). Two real server processes on the random tiny checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import requests

from dsv4bisect.probe.client import ProbeClient, ProbeHTTPError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
MESSAGES = [{"role": "user", "content": "Repeat the number 42, then count to five."}]


def _start(api: str) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "dsv4bisect", "serve", "--port", "0", "--device", "cpu",
            "--checkpoint", "random", "--max-model-len", "1024", "--api", api]
    proc = subprocess.Popen(argv, env=dict(os.environ), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("ready:"):
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, next(w for w in line.split() if w.startswith("http"))
    proc.wait()
    raise AssertionError(f"serve --api {api} exited {proc.returncode}")


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    procs = {api: _start(api) for api in ("vllm", "sglang")}
    yield {api: url for api, (_, url) in procs.items()}
    for proc, _ in procs.values():
        proc.terminate()
        proc.wait(timeout=60)


def test_vllms_shapes_and_errors(servers: dict[str, str]) -> None:
    url = servers["vllm"]
    card = requests.get(f"{url}/v1/models", timeout=30).json()["data"][0]
    assert card["owned_by"] == "vllm" and card["max_model_len"] == 1024
    assert requests.get(f"{url}/health", timeout=30).status_code == 200
    assert requests.get(f"{url}/generate", timeout=30).status_code == 404  # SGLang's only
    bad = requests.post(f"{url}/v1/completions", json={"prompt": "hi", "n": 2}, timeout=30)
    assert bad.status_code == 400
    assert set(bad.json()) == {"error"} and set(bad.json()["error"]) == {
        "message", "type", "param", "code"}
    long = requests.post(f"{url}/v1/completions", json={"prompt": [5] * 1100}, timeout=60)
    assert "maximum context length is 1024 tokens" in long.json()["error"]["message"]
    client = ProbeClient(url)
    with pytest.raises(ProbeHTTPError) as err:
        client.request("POST", "/v1/completions", {"prompt": "hi", "n": 2})
    assert "(BadRequestError)" in err.value.message  # the client reads vLLM's error body


def test_the_probe_measures_the_same_over_both_apis(servers: dict[str, str]) -> None:
    got = {}
    for api, url in servers.items():
        client = ProbeClient(url)
        server = client.describe()
        assert client.api == api and server.compress_ratios and server.sliding_window
        ids = client.tokenize_messages(MESSAGES)
        client.flush_cache()
        answer = client.generate(ids, max_new_tokens=12)
        scored = client.score(ids + answer, start=5, top_k=4)
        chat = client.chat(MESSAGES, max_tokens=12)
        got[api] = (server.compress_ratios, ids, answer, scored, chat.text, chat.prompt_tokens)
    (ra, ia, aa, (pa, la, ta), ca, na), (rb, ib, ab, (pb, lb, tb), cb, nb) = got.values()
    assert (ra, ia, aa, pa, ca, na) == (rb, ib, ab, pb, cb, nb)
    assert pa[0] == 6 and len(pa) == len(ia) + len(aa) - 6
    assert max(abs(x - y) for x, y in zip(la, lb)) <= 1e-6
    assert [[t for t, _ in row] for row in ta] == [[t for t, _ in row] for row in tb]


def test_prompt_logprobs_skip_the_prefix_cache_as_vllm_does(servers: dict[str, str]) -> None:
    url = servers["vllm"]
    prompt = list(range(3, 200))

    def cached(**extra: object) -> int:
        body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, **extra}
        data = requests.post(f"{url}/v1/completions", json=body, timeout=120).json()
        return data["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert requests.post(f"{url}/reset_prefix_cache", timeout=30).status_code == 200
    assert cached() == 0
    assert cached() > 0  # the same prompt again: a prefix-cache hit
    assert cached(prompt_logprobs=2) == 0  # vLLM: skip_reading_prefix_cache
    assert requests.post(f"{url}/reset_prefix_cache", timeout=30).status_code == 200
    assert cached() == 0
