"""The reference HTTP server, as a real `dsv4bisect serve` process on the random tiny model.

The probe talks to this server and to SGLang the same way, so these tests pin SGLang's request
and response shapes, the teacher-forcing contract of `/generate`, and the process lifecycle.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from dsv4bisect.reference.request_body import ApiError, Body, check_sampling

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

MAX_MODEL_LEN = 2048
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]

def serve_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "dsv4bisect", "serve", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int, env: dict[str, str] | None = None,
                 *extra: str) -> subprocess.Popen[str]:
    argv = serve_argv("--port", str(port), "--device", "cpu", "--checkpoint", "random",
                      "--max-model-len", str(MAX_MODEL_LEN), *extra)
    return subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_healthy(proc: subprocess.Popen[str], url: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {proc.stderr.read()}")
        try:
            if requests.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except (requests.ConnectionError, requests.Timeout):  # not up, or loading
            pass  # on a busy machine (torch's import holds the GIL for a second or more)
        time.sleep(0.3)
    raise AssertionError("server did not become healthy")


def stop(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, err


def _serving(*args: str | None) -> Iterator[str]:
    """A `serve` process for a module's tests: its base URL, stopped at the end."""
    port = free_port()
    proc = start_server(port, *args)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base)
        yield base
    finally:
        if proc.poll() is None:
            stop(proc)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from _serving()


def post(url: str, path: str, body: Any) -> requests.Response:
    return requests.post(f"{url}{path}", json=body, timeout=300)


def ok(url: str, path: str, body: Any) -> Any:
    r = post(url, path, body)
    assert r.status_code == 200, r.text
    return r.json()


def tokenize_chat(url: str, messages: list[dict[str, Any]]) -> list[int]:
    return list(ok(url, "/tokenize", {"messages": messages})["tokens"])


# ---- info endpoints --------------------------------------------------------------------------


def test_info_endpoints(url: str) -> None:
    health = requests.get(f"{url}/health", timeout=10)
    assert health.status_code == 200
    assert requests.get(f"{url}/health_generate", timeout=60).status_code == 200
    models = requests.get(f"{url}/v1/models", timeout=10).json()
    assert models["object"] == "list"
    assert models["data"][0]["max_model_len"] == MAX_MODEL_LEN
    assert isinstance(models["data"][0]["id"], str)
    for path in ("/server_info", "/get_server_info"):
        info = requests.get(f"{url}{path}", timeout=10).json()
        assert info["compress_ratios"][:6] == [0, 0, 4, 16, 4, 16]
        assert info["max_model_len"] == MAX_MODEL_LEN
        assert info["patches"] == {}
        assert info["moe_backend"] == "triton" and info["chunk_size"] == 2048
        assert info["device"] and info["version"]
    flush = requests.post(f"{url}/flush_cache", timeout=10)
    assert flush.status_code == 200 and flush.text == "Cache flushed.\n"
    assert requests.get(f"{url}/flush_cache", timeout=10).status_code == 405  # POST only: csrf.py


# ---- /generate: teacher forcing ----------------------------------------------------------------


@pytest.fixture(scope="module")
def exact_url() -> Iterator[str]:
    """A server at `precision: exact`: at `deployment` a decode step and a prefill take
    different kernels, as on SGLang (reference/dispatch.py), so their logprobs differ there."""
    yield from _serving(None, "--precision", "exact")


def test_teacher_forced_logprobs_equal_greedy_generation(exact_url: str) -> None:
    url = exact_url
    prompt = tokenize_chat(url, CHAT)
    gen = ok(url, "/generate", {
        "input_ids": prompt, "sampling_params": {"max_new_tokens": 12, "temperature": 0},
        "return_logprob": True, "top_logprobs_num": 3,
    })
    out_ids = gen["output_ids"]
    meta = gen["meta_info"]
    assert len(out_ids) == meta["completion_tokens"] > 0
    assert meta["prompt_tokens"] == len(prompt)
    # logprob_start_len -1: only the last prompt position, with no log-prob (SGLang's report)
    assert meta["input_token_logprobs"] == [[None, prompt[-1], None]]
    assert [e[1] for e in meta["output_token_logprobs"]] == out_ids
    for entry, top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert len(top) == 3 and top[0][1] == entry[1]  # greedy: the chosen token is the top-1
        assert top[0][0] == pytest.approx(entry[0])

    forced = ok(url, "/generate", {
        "input_ids": prompt + out_ids, "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True, "logprob_start_len": len(prompt) - 1, "top_logprobs_num": 3,
    })
    fmeta = forced["meta_info"]
    assert forced["output_ids"] == [] and fmeta["completion_tokens"] == 0
    assert fmeta["finish_reason"] == {"type": "length", "length": 0}
    entries = fmeta["input_token_logprobs"]
    assert entries[0] == [None, prompt[-1], None]
    assert [e[1] for e in entries[1:]] == out_ids
    generated = [e[0] for e in meta["output_token_logprobs"]]
    assert [e[0] for e in entries[1:]] == pytest.approx(generated, abs=2e-4)
    assert fmeta["input_top_logprobs"][0] is None
    assert [t[0][1] for t in fmeta["input_top_logprobs"][1:]] == out_ids


def test_generate_whole_prompt_scoring_text_and_batch(url: str) -> None:
    ids = [0, 16 + 72, 16 + 105, 16 + 33, 16 + 10]
    scored = ok(url, "/generate", {
        "input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
        "logprob_start_len": 0, "return_text_in_logprobs": True, "token_ids_logprob": [1, 20],
    })["meta_info"]
    entries = scored["input_token_logprobs"]
    assert [e[1] for e in entries] == ids and entries[0][0] is None
    assert all(isinstance(e[0], float) and e[0] <= 0 for e in entries[1:])
    assert [e[2] for e in entries[1:]] == ["H", "i", "!", "\n"]
    chosen = scored["input_token_ids_logprobs"]
    assert chosen[0] is None and [c[1] for c in chosen[1]] == [1, 20]

    by_text = ok(url, "/generate", {"text": "Hi!\n", "sampling_params": {"max_new_tokens": 2}})
    assert by_text["meta_info"]["prompt_tokens"] == len(ids)  # text gets bos, as DeepSeek's does
    by_ids = ok(url, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}})
    assert by_text["output_ids"] == by_ids["output_ids"]
    batch = ok(url, "/generate", {"input_ids": [ids, ids[:3]],
                                  "sampling_params": {"max_new_tokens": 2}})
    assert isinstance(batch, list) and batch[0]["output_ids"] == by_ids["output_ids"]


def test_stop_token_ids_and_stop_strings(url: str) -> None:
    prompt = tokenize_chat(url, CHAT)
    base = ok(url, "/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 24}})
    out = base["output_ids"]
    stop_id = out[3]
    first = out.index(stop_id)
    cut = ok(url, "/generate", {"input_ids": prompt, "sampling_params": {
        "max_new_tokens": 24, "stop_token_ids": [stop_id]}})
    assert cut["output_ids"] == out[: first + 1]
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}

    printable = [i for i, t in enumerate(out) if 16 + 33 <= t <= 16 + 126]
    assert printable, "the seed-0 model should print some ASCII within 24 tokens"
    char = chr(out[printable[0]] - 16)
    stopped = ok(url, "/generate", {"input_ids": prompt, "sampling_params": {
        "max_new_tokens": 24, "stop": [char]}})
    assert stopped["output_ids"] == out[: printable[0] + 1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": char}
    assert char not in stopped["text"]


# ---- OpenAI endpoints --------------------------------------------------------------------------


def test_chat_completion_shape_usage_and_determinism(url: str) -> None:
    body = {"model": "anything", "messages": CHAT, "max_tokens": 6, "temperature": 0,
            "top_p": 1, "top_k": -1, "logprobs": True, "top_logprobs": 2,
            "chat_template_kwargs": {"thinking": False}, "return_prompt_token_ids": True,
            "return_token_ids": True}
    first, second = ok(url, "/v1/chat/completions", body), ok(url, "/v1/chat/completions", body)
    assert first["choices"] == second["choices"]  # greedy is deterministic
    assert first["object"] == "chat.completion" and first["id"].startswith("chatcmpl-")
    choice = first["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    usage = first["usage"]
    prompt = tokenize_chat(url, CHAT)
    assert usage["prompt_tokens"] == len(prompt) == ok(url, "/v1/tokenize",
                                                        {"messages": CHAT})["count"]
    assert choice["prompt_token_ids"] == prompt
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    content = choice["logprobs"]["content"]
    assert len(content) == usage["completion_tokens"] == len(choice["token_ids"])
    for item in content:
        assert set(item) == {"token", "bytes", "logprob", "top_logprobs"}
        assert len(item["top_logprobs"]) == 2
        assert item["top_logprobs"][0]["logprob"] >= item["top_logprobs"][1]["logprob"]
    gen = ok(url, "/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 6}})
    assert gen["output_ids"] == choice["token_ids"]
    no_lp = ok(url, "/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 2})
    assert no_lp["choices"][0]["logprobs"] is None and no_lp["usage"]["completion_tokens"] <= 2


def test_completions_text_ids_and_echo(url: str) -> None:
    ids = [0, 16 + 97, 16 + 98]
    by_ids = ok(url, "/v1/completions", {"prompt": ids, "max_tokens": 4, "logprobs": 2})
    by_text = ok(url, "/v1/completions", {"prompt": "ab", "max_tokens": 4, "logprobs": 2})
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert by_text["object"] == "text_completion" and by_text["usage"]["prompt_tokens"] == 3
    lp = by_text["choices"][0]["logprobs"]
    n = by_text["usage"]["completion_tokens"]
    assert len(lp["token_logprobs"]) == len(lp["tokens"]) == len(lp["top_logprobs"]) == n
    echo = ok(url, "/v1/completions", {"prompt": "ab", "max_tokens": 4, "logprobs": 1,
                                       "echo": True})["choices"][0]
    assert echo["text"].startswith("ab")
    assert echo["logprobs"]["token_logprobs"][0] is None
    assert len(echo["logprobs"]["token_logprobs"]) == 3 + n
    assert echo["logprobs"]["token_logprobs"][3:] == pytest.approx(lp["token_logprobs"], abs=2e-4)


def test_tokenize_prompt_and_messages(url: str) -> None:
    r = ok(url, "/tokenize", {"prompt": "é"})
    assert r == {"tokens": [0, 16 + 0xC3, 16 + 0xA9], "count": 3, "max_model_len": MAX_MODEL_LEN}
    assert ok(url, "/tokenize", {"prompt": "é", "add_special_tokens": False})["count"] == 2
    assert ok(url, "/tokenize", {"prompt": ["a", "bc"]})["count"] == [2, 3]
    no_gen = ok(url, "/tokenize", {"messages": CHAT, "add_generation_prompt": False})
    assert no_gen["tokens"] == tokenize_chat(url, CHAT)[:-2]


# ---- interop: the model id, model names, lm-eval ----------------------------------------------


def test_the_model_id_is_the_model_path_as_given(url: str) -> None:
    """SGLang's served_model_name defaults to --model-path as typed (not a resolved path)."""
    (card,) = requests.get(f"{url}/v1/models", timeout=10).json()["data"]
    assert card["id"] == card["root"] == "random"  # the fixture's `--checkpoint random`
    info = requests.get(f"{url}/server_info", timeout=10).json()
    assert info["served_model_name"] == info["model_path"] == "random"
    assert requests.get(f"{url}/get_model_info", timeout=10).json()["model_path"] == "random"


def test_any_model_name_is_accepted_and_echoed_as_sglang_does(url: str) -> None:
    done = ok(url, "/v1/completions", {"model": "deepseek-v4-typo", "prompt": "ab",
                                       "max_tokens": 2})
    assert done["model"] == "deepseek-v4-typo"
    chat = ok(url, "/v1/chat/completions", {"model": "x", "messages": CHAT, "max_tokens": 2})
    assert chat["model"] == "x"
    assert ok(url, "/v1/completions", {"prompt": "ab", "max_tokens": 2})["model"] == "random"


def _lm_eval_parse(choice: dict[str, Any], ctxlen: int) -> tuple[float, bool]:
    """lm-eval 0.4.13's `LocalCompletionsAPI.parse_logprobs`, for one choice."""
    token_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
    top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
    greedy = all(tok == max(top.values()) for tok, top in zip(token_logprobs, top_logprobs))
    return sum(token_logprobs), greedy


def test_lm_eval_loglikelihood_request_equals_teacher_forced_scores(exact_url: str) -> None:
    """lm-eval's `local-completions` with `tokenized_requests` sends, for log-likelihood tasks,
    a batch of token-id prompts (context + continuation) with echo, logprobs 1 and max_tokens
    1 (lm_eval/models/openai_completions.py `_create_payload`, generate=False), and sums
    `token_logprobs[ctxlen:-1]`; the answer must be the teacher-forced scores of /generate."""
    url = exact_url

    def tok(text: str) -> list[int]:  # lm-eval's RemoteTokenizer.encode
        return list(ok(url, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"])

    bos = 0
    requests_ = [([bos, *tok("The colour of the sky is")], tok(" blue")),
                 ([bos, *tok("2 + 2 =")], tok(" 4, of course"))]
    # a continuation the model itself would pick greedily, so that is_greedy is True once
    greedy_cont = ok(url, "/generate", {"input_ids": requests_[0][0], "sampling_params": {
        "max_new_tokens": 3, "temperature": 0, "ignore_eos": True}})["output_ids"]
    requests_.append((requests_[0][0], greedy_cont))
    payload = {"model": "random", "prompt": [c + x for c, x in requests_], "temperature": 0,
               "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True}
    answer = ok(url, "/v1/completions", payload)
    choices = sorted(answer["choices"], key=lambda c: c["index"])
    assert len(choices) == len(requests_)
    for choice, (context, continuation) in zip(choices, requests_):
        got, greedy = _lm_eval_parse(choice, len(context))
        forced = ok(url, "/generate", {
            "input_ids": context + continuation, "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True, "logprob_start_len": len(context) - 1,
            "top_logprobs_num": 1})["meta_info"]
        scores = [e[0] for e in forced["input_token_logprobs"][1:]]
        assert len(scores) == len(continuation)
        assert got == pytest.approx(sum(scores), abs=1e-4)
        tops = [t[0][1] for t in forced["input_top_logprobs"][1:]]
        assert greedy == (tops == continuation)
    assert _lm_eval_parse(choices[2], len(requests_[2][0]))[1] is True


def test_detokenize_and_tokenizer_info_for_remote_tokenizer_clients(url: str) -> None:
    ids = [0, 16 + ord("h"), 16 + ord("i"), 1]
    assert ok(url, "/detokenize", {"tokens": ids}) == {"text": "hi", "prompt": "hi"}
    assert ok(url, "/v1/detokenize", {"tokens": ids, "skip_special_tokens": False})["text"] == \
        "<｜begin▁of▁sentence｜>hi<｜end▁of▁sentence｜>"
    assert ok(url, "/detokenize", {"tokens": [ids, []]})["text"] == ["hi", ""]
    assert post(url, "/detokenize", {"tokens": [0, 99999]}).status_code == 400
    assert post(url, "/detokenize", {"tokens": "hi"}).status_code == 400
    info = requests.get(f"{url}/tokenizer_info", timeout=10).json()
    assert info["bos_token"] == "<｜begin▁of▁sentence｜>"
    assert info["eos_token"] == "<｜end▁of▁sentence｜>"
    assert info["model_max_length"] == MAX_MODEL_LEN


# ---- errors ------------------------------------------------------------------------------------

BAD_REQUESTS = [
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": CHAT, "temperature": -0.7}),
    ("/v1/chat/completions", {"messages": CHAT, "top_p": 0}),
    ("/v1/chat/completions", {"messages": CHAT, "chat_template_kwargs": {"thinking": True}}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": "5"}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": MAX_MODEL_LEN}),
    ("/v1/chat/completions", {"messages": CHAT, "n": 2}),
    ("/v1/chat/completions", {"messages": CHAT, "stream": "yes"}),
    ("/v1/chat/completions", {"messages": CHAT, "stream": True, "n": 2}),  # before any event
    ("/v1/completions", {"prompt": "a", "stream": True, "best_of": 2}),
    ("/generate", {"input_ids": [0, 20], "stream": True, "sampling_params": {"n": 2}}),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}),
    ("/v1/completions", {"prompt": ""}),
    ("/v1/completions", {"prompt": [0, 9999]}),
    ("/v1/completions", {"prompt": "a", "logprobs": True}),
    ("/generate", {"input_ids": [0, 20], "return_logprob": True, "logprob_start_len": 2}),
    ("/generate", {"input_ids": [0, 20], "sampling_params": {"best_of": 2}}),
    ("/generate", {"input_ids": [0, 20], "sampling_params": {"max_new_tokens": -1}}),
    ("/generate", {"text": "a", "input_ids": [0]}),
    ("/generate", {"input_ids": [0] * (MAX_MODEL_LEN + 1)}),
    ("/generate", [1, 2]),
    ("/tokenize", {"prompt": "a", "messages": CHAT}),
    ("/tokenize", {"prompt": 3}),
]


@pytest.mark.parametrize(("path", "body"), BAD_REQUESTS)
def test_bad_requests_get_400_json(url: str, path: str, body: Any) -> None:
    r = post(url, path, body)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["object"] == "error" and err["type"] == "BadRequestError" and err["code"] == 400
    assert err["message"] and "Traceback" not in err["message"]


def test_malformed_json_unknown_path_and_wrong_method(url: str) -> None:
    json_type = {"Content-Type": "application/json"}
    r = requests.post(f"{url}/generate", data=b"{not json", headers=json_type, timeout=10)
    assert r.status_code == 400 and r.json()["type"] == "BadRequestError"
    r = requests.post(f"{url}/v1/chat/completions", data=b"\xff\xfe", headers=json_type,
                      timeout=10)
    assert r.status_code == 400
    assert requests.get(f"{url}/nope", timeout=10).status_code == 404
    r = requests.get(f"{url}/generate", timeout=10)
    assert r.status_code == 405 and "POST" in r.headers["Allow"] and r.json()["code"] == 405
    assert requests.head(f"{url}/health", timeout=10).status_code == 200
    assert requests.get(f"{url}/health", timeout=10).status_code == 200


def test_health_does_not_wait_for_the_model(url: str) -> None:
    prompt = [0] + [16 + 97] * 1500
    done = threading.Event()

    def long_request() -> None:
        post(url, "/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 32}})
        done.set()

    worker = threading.Thread(target=long_request)
    worker.start()
    answered_while_busy = 0
    while not done.is_set():
        tic = time.monotonic()
        assert requests.get(f"{url}/health", timeout=5).status_code == 200
        assert time.monotonic() - tic < 1.0
        answered_while_busy += not done.is_set()
        time.sleep(0.05)
    worker.join()
    assert answered_while_busy > 0


# ---- process lifecycle -------------------------------------------------------------------------


def test_patch_set_from_env_and_sigterm_stops_cleanly() -> None:
    port = free_port()
    env = {"DSV4BISECT_PATCHES": "mma-decode:merge-no-rescale,hash-topk-scaling"}
    proc = start_server(port, env)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}")
        info = requests.get(f"http://127.0.0.1:{port}/server_info", timeout=10).json()
    finally:
        rc, err = stop(proc)
    assert info["patches"] == {"hash-topk-scaling": "topk", "mma-decode": "merge-no-rescale"}
    assert rc == 0, err
    assert "ready:" in err


def test_unknown_patch_exits_5_with_error() -> None:
    proc = start_server(free_port(), {"DSV4BISECT_PATCHES": "mma-decod"})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 5
    assert "error:" in err and "mma-decod" in err and "hint:" in err


def test_busy_port_exits_125() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        proc = start_server(int(s.getsockname()[1]))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 125 and "already in use" in err


# ---- request parsing (in process) --------------------------------------------------------------


def test_body_getters_keep_json_types_apart() -> None:
    body = Body({"a": True, "b": 1, "c": "x", "d": ["s", "t"], "e": [1, 2], "f": None})
    assert body.get_bool("a", False) is True and body.get_int("b", 0) == 1
    assert body.get_int("f", 7) == 7 and body.get_strs("c") == ("x",)
    assert body.get_strs("d") == ("s", "t")
    assert body.get_ints("e") == (1, 2)
    for call in (lambda: body.get_int("a", 0), lambda: body.get_bool("b", False),
                 lambda: body.get_ints("d"), lambda: body.get_strs("b")):
        with pytest.raises(ApiError):
            call()
    assert Body({"temperature": 0.5, "top_k": 0, "seed": 3}).sampling("seed") == {
        "temperature": 0.5, "top_p": 1.0, "top_k": -1, "seed": 3}
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -2},
                {"temperature": "hot"}):
        with pytest.raises(ApiError):
            Body(bad).sampling("seed")
    check_sampling(Body({"temperature": 0, "min_p": 0, "n": 1}), ("min_p", "n"))
    with pytest.raises(ApiError, match="`n`=true"):
        check_sampling(Body({"n": True}), ("n",))
    assert json.loads(json.dumps(ApiError("m").message)) == "m"


def test_sampling_with_a_seed_is_repeatable_and_differs_from_greedy(url: str) -> None:
    body = {"messages": CHAT, "max_tokens": 12, "temperature": 1.0, "top_p": 0.95, "seed": 11}
    first, again = (ok(url, "/v1/chat/completions", body) for _ in range(2))
    assert first["choices"][0]["message"] == again["choices"][0]["message"]
    sp = {"max_new_tokens": 12, "temperature": 1.0, "top_k": 50, "sampling_seed": 3}
    drawn = ok(url, "/generate", {"input_ids": [0, 20, 21], "sampling_params": sp})
    greedy = ok(url, "/generate", {"input_ids": [0, 20, 21], "sampling_params": {
        "max_new_tokens": 12, "temperature": 0}})
    assert drawn["output_ids"] != greedy["output_ids"]
