"""lm-eval's own `local-completions` client against `dsv4bisect serve`: log-likelihoods through
its remote tokenizer, compared with the teacher-forced scores of `/generate`.

    python tests/benchmarks/lm_eval_loglikelihood.py [--checkpoint embedded] [--port 30417]

Needs lm-eval with its API client importable (not a dependency of the project): `pip install
'lm-eval[api]'` (the `api` extra brings aiohttp, tenacity, tqdm, requests and tiktoken, which
`LocalCompletionsAPI` imports; a bare `pip install lm_eval` lacks them), or its wheel unpacked
on PYTHONPATH with those beside it. Starts `serve` at
`--precision exact`, asks lm-eval's `LocalCompletionsAPI(tokenizer_backend="remote",
tokenized_requests=True, custom_prefix_token_id=0)` for three log-likelihoods (one with an
empty context), prints each beside the teacher-forced sum, stops the server, and exits 1 if any
differs by more than 1e-4. docs/reference-api.md ("lm-eval against `serve`") records a run.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time

import requests

PAIRS = [("Question: what colour is the sky?\nAnswer:", " blue"),
         ("Question: what colour is the sky?\nAnswer:", " green"),
         ("", "The sky is blue.")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--checkpoint", default="embedded")
    ap.add_argument("--port", type=int, default=30417)
    args = ap.parse_args()
    try:
        from lm_eval.api.instance import Instance
        from lm_eval.models.openai_completions import LocalCompletionsAPI
    except ImportError as exc:  # lm_eval without its `api` extra: aiohttp, tenacity, tqdm
        sys.exit(f"error: {exc}\nhint: pip install 'lm-eval[api]' (the api extra is what "
                 "LocalCompletionsAPI imports)")

    base = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen([sys.executable, "-m", "dsv4bisect", "serve", "--port",
                               str(args.port), "--device", "cpu", "--checkpoint", args.checkpoint,
                               "--precision", "exact"], stderr=subprocess.DEVNULL)
    try:
        _wait(base, server)
        model = requests.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
        lm = LocalCompletionsAPI(model=model, base_url=f"{base}/v1/completions",
                                 tokenizer_backend="remote", tokenized_requests=True,
                                 custom_prefix_token_id=0)
        got = lm.loglikelihood([Instance("loglikelihood", {}, pair, i)
                                for i, pair in enumerate(PAIRS)], disable_tqdm=True)
        worst = 0.0
        for (context, continuation), (ll, greedy) in zip(PAIRS, got):
            forced = _teacher_forced(base, context, continuation)
            worst = max(worst, abs(ll - forced))
            print(f"{context!r:46} {continuation!r:19} lm-eval {ll:.5f} (greedy {greedy})  "
                  f"teacher-forced {forced:.5f}")
        print(f"model id {model!r}; largest difference {worst:.2e}")
        if worst > 1e-4:
            sys.exit(1)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def _wait(base: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if requests.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    sys.exit("the server did not come up")


def _teacher_forced(base: str, context: str, continuation: str) -> float:
    def tok(text: str) -> list[int]:
        return requests.post(f"{base}/tokenize", json={"prompt": text, "add_special_tokens": False},
                             timeout=60).json()["tokens"]

    ctx = tok(context) if context else [0]  # lm-eval scores an empty context from bos
    ids = ctx + tok(continuation)
    meta = requests.post(f"{base}/generate", json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
        "logprob_start_len": len(ctx) - 1}, timeout=300).json()["meta_info"]
    return sum(e[0] for e in meta["input_token_logprobs"][1:])


if __name__ == "__main__":
    main()
