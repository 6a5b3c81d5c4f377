"""Every request the probe sends over vLLM's API fits vLLM's own request models, as extracted
from each verified release's wheel (shipped facts): vLLM drops an unknown field silently, so a
misspelt one would change what the probe measures without a word."""

from __future__ import annotations

import pytest

from dsv4bisect.base.vllm_releases import VERIFIED, load_facts
from dsv4bisect.errors import ProbeError
from dsv4bisect.probe import vllm_requests as vr
from dsv4bisect.probe.client import ProbeClient, chat_body

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
IDS = [0, 5, 6, 7, 8]


def _bodies() -> list[tuple[str, dict]]:
    return [
        ("/v1/chat/completions", chat_body("m", MESSAGES, 64, False)),
        ("/v1/chat/completions", chat_body(None, MESSAGES, 4096, True)),
        ("/v1/completions", vr.completion("m", IDS, 32)),
        ("/v1/completions", vr.score("m", IDS, 20, 0)),
        ("/v1/completions", vr.score(None, IDS, 5, 1)),
        ("/tokenize", vr.tokenize("m", MESSAGES)),
    ]


@pytest.mark.parametrize("path,body", _bodies())
def test_the_probes_requests_fit_every_release(path: str, body: dict) -> None:
    assert vr.problems(path, body) == []


def test_the_fields_the_probe_relies_on_exist_in_every_release() -> None:
    for release in VERIFIED:
        completion = load_facts(release)["requests"]["CompletionRequest"]["fields"]
        assert {"prompt_logprobs", "return_token_ids", "logprobs", "max_tokens"} <= set(
            completion), release
        usage = load_facts(release)["requests"]["UsageInfo"]["fields"]
        assert "prompt_tokens_details" in usage  # cached_tokens, with the server flag on
        error = load_facts(release)["requests"]["ErrorResponse"]["fields"]
        assert set(error) == {"error"}  # {"error": {"message", "type", "param", "code"}}


@pytest.mark.parametrize("path,body,problem", [
    ("/v1/completions", {"prompt": IDS, "logprob_start_len": 3},
     "has no field `logprob_start_len`"),
    ("/v1/completions", {"prompt": IDS, "prompt_logprobs": "5"}, "prompt_logprobs: str where"),
    ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs_num": 5}, "no field"),
    ("/tokenize", {"messages": MESSAGES, "add_generation_prompt": "yes"}, "str where bool"),
])
def test_a_request_vllm_would_not_take_is_named(path: str, body: dict, problem: str) -> None:
    found = vr.problems(path, body)
    assert any(problem in p for p in found), found


def test_the_client_refuses_to_send_a_body_vllm_would_drop() -> None:
    client = ProbeClient("http://127.0.0.1:9", api="vllm", retries=0)
    with pytest.raises(ProbeError) as err:  # refused before any connection is tried
        client.request("POST", "/v1/completions", {"prompt": IDS, "input_ids": IDS})
    assert "does not fit vLLM's request model" in err.value.message


def test_prompt_logprobs_are_read_as_sglangs_input_logprobs() -> None:
    """vLLM keys each position's dict by token id (the prompt token and the top k by rank);
    the probe takes the positions after `start` and the top k only."""
    rows = [None,
            {"5": {"logprob": -1.0, "rank": 2}, "9": {"logprob": -0.5, "rank": 1}},
            {"6": {"logprob": -3.0, "rank": 7}, "1": {"logprob": -0.1, "rank": 1},
             "2": {"logprob": -2.5, "rank": 2}},
            {"7": {"logprob": None, "rank": 1}}]
    data = {"choices": [{"prompt_logprobs": rows}]}
    pos, lps, tops = vr.prompt_scores(data, [0, 5, 6, 7], start=0, top_k=2)
    assert pos == [1, 2, 3]
    assert lps[:2] == [-1.0, -3.0] and lps[2] != lps[2]  # null: non-finite (NaN)
    assert tops[0] == [(9, -0.5), (5, -1.0)] and tops[1] == [(1, -0.1), (2, -2.5)]
    with pytest.raises(ValueError):
        vr.prompt_scores({"choices": [{"prompt_logprobs": rows[:2]}]}, [0, 5, 6], 0, 2)


def test_error_shapes() -> None:
    vllm = {"error": {"message": "max_tokens too large", "type": "BadRequestError",
                      "param": None, "code": 400}}
    assert vr.error_message(vllm) == "max_tokens too large (BadRequestError)"
    assert vr.error_message({"detail": "Not Found"}) == "Not Found"
    assert vr.error_message({"object": "error", "message": "bad"}) == "bad"
    assert vr.error_message("x") is None
