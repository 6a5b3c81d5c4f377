"""Continuous batching and the prefix cache through a real `dsv4bisect serve --precision exact`
on the shipped checkpoint: concurrent requests get the answers they get one at a time, a
multi-turn replay hits the cache with the answers of a from-scratch run, and concurrent requests
share batches. Slow (an engine process per test)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

QUESTIONS = [f"{verb} the number {n}." for verb in ("Repeat", "Double", "Spell", "Reverse")
             for n in (3, 17, 42, 105, 256, 999, 1234, 8080)]  # 32 distinct prompts


def start(*extra: str) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "dsv4bisect", "serve", "--port", "0", "--device", "cpu",
            "--precision", "exact", "--max-model-len", "4096", *extra]
    proc = subprocess.Popen(argv, env=dict(os.environ), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        for line in proc.stderr:  # the ready: line is on stderr; ends when serve exits
            lines.append(line)
            if line.startswith("ready:"):
                # keep reading stderr (one line per request) so the pipe never fills
                threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
                return proc, next(w for w in line.split() if w.startswith("http"))
    except BaseException:  # a timeout while loading: leave no engine behind
        proc.kill()
        proc.wait()
        raise
    proc.wait()
    raise AssertionError(f"serve exited {proc.returncode}: {''.join(lines[-20:])}")


@pytest.fixture
def server() -> Iterator[Any]:
    procs = []

    def launch(*extra: str) -> str:
        proc, url = start(*extra)
        procs.append(proc)
        return url

    yield launch
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def chat(url: str, messages: list[dict[str, str]], max_tokens: int = 24) -> dict[str, Any]:
    r = requests.post(f"{url}/v1/chat/completions", timeout=600, json={
        "messages": messages, "max_tokens": max_tokens, "temperature": 0,
        "return_token_ids": True})
    assert r.status_code == 200, r.text
    return r.json()


def answer(reply: dict[str, Any]) -> tuple[str | None, list[int], str]:
    choice = reply["choices"][0]
    return choice["message"]["content"], choice["token_ids"], choice["finish_reason"]


def info(url: str) -> dict[str, Any]:
    return requests.get(f"{url}/server_info", timeout=30).json()


def test_32_concurrent_chats_answer_as_one_at_a_time(server) -> None:
    url = server()
    convs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    alone = []
    for conv in convs:
        alone.append(answer(chat(url, conv)))
        assert info(url)["running_requests"] == 0
    assert requests.post(f"{url}/flush_cache", timeout=30).status_code == 200
    before = info(url)
    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda c: answer(chat(url, c)), convs))
    assert together == alone
    after = info(url)
    assert after["prefix_cache_hit_tokens"] == before["prefix_cache_hit_tokens"] == 0
    assert after["peak_running_requests"] > 1
    assert after["decode_batches"] - before["decode_batches"] < sum(len(a[1]) for a in alone)


def test_a_multi_turn_replay_hits_the_cache_and_answers_as_from_scratch(server) -> None:
    url = server()
    users = ["Remember the word kiwi.", "What word did I ask you to remember?",
             "Say it twice.", "Now spell it backwards."]
    history: list[dict[str, str]] = []
    warm, cached = [], []
    for text in users:
        history.append({"role": "user", "content": text})
        reply = chat(url, history, max_tokens=32)
        warm.append(answer(reply))
        cached.append(reply["usage"]["prompt_tokens_details"]["cached_tokens"])
        history.append({"role": "assistant", "content": warm[-1][0] or ""})
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    assert info(url)["prefix_cache_hit_tokens"] == sum(cached) > 0
    # from scratch: the same conversation, the cache emptied before every turn
    cold, turns = [], [history[: 2 * k + 1] for k in range(len(users))]
    for messages in turns:
        assert requests.post(f"{url}/flush_cache", timeout=30).text == "Cache flushed.\n"
        reply = chat(url, messages, max_tokens=32)
        assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        cold.append(answer(reply))
    assert cold == warm
    # --disable-radix-cache: nothing is cached, the same answers
    off = server("--disable-radix-cache")
    assert [answer(chat(off, m, max_tokens=32)) for m in turns] == warm
    assert info(off)["prefix_cache_hit_tokens"] == 0 and info(off)["disable_radix_cache"]


def test_16_concurrent_generate_requests_share_batches(server) -> None:
    url = server("--chunk-size", "256")
    prompts = [list(range(40 + i, 140 + i)) for i in range(16)]

    def generate(ids: list[int]) -> list[int]:
        r = requests.post(f"{url}/generate", timeout=600, json={
            "input_ids": ids, "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}})
        assert r.status_code == 200, r.text
        return r.json()["output_ids"]

    serial = [generate(p) for p in prompts]
    assert info(url)["peak_running_requests"] == 1
    assert requests.post(f"{url}/flush_cache", timeout=30).status_code == 200
    with ThreadPoolExecutor(16) as pool:
        batched = list(pool.map(generate, prompts))
    assert batched == serial
    stats = info(url)
    assert stats["peak_running_requests"] > 1
    assert stats["prefill_tokens_computed"] == 2 * sum(len(p) for p in prompts)
