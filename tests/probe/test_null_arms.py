"""What an SGLang server receives for the null model's re-chunked arm (`runner.null_arms`), and
the record the arm makes of the answers. A recording server stands in for SGLang (whose radix
cache cannot run here); `test_null_arms_e2e.py` runs the arm against the embedded engine."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from dsv4bisect.probe.client import ProbeClient
from dsv4bisect.probe.drift import DriftRecord
from dsv4bisect.probe.null import CONCURRENT_ARM, RECHUNK_ARM
from dsv4bisect.probe.runner import null_arms
from dsv4bisect.probe.spec import tier_spec

SPEC = tier_spec("smoke")
IDS = tuple(range(100, 141))  # 41 tokens: scored window from position 2 (start 1), splits 11, 21, 31


def logprob(pos: int) -> float:
    return -0.01 * pos  # the same value wherever a position is scored: the merge can be checked


class Recorder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.bodies: list[tuple[str, dict[str, Any]]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Recorder

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        self.server.bodies.append((self.path, body))
        out: dict[str, Any] = {}
        if self.path == "/generate":
            ids, start = body["input_ids"], body["logprob_start_len"]
            # SGLang's shape: one entry per input position from logprob_start_len, the first
            # without a logprob here (as the embedded engine reports it)
            entries = [[None if p == start else logprob(p), ids[p]] for p in range(start, len(ids))]
            tops = [None if p == start else [[logprob(p), ids[p]], [-5.0, 7]]
                    for p in range(start, len(ids))]
            new = body["sampling_params"]["max_new_tokens"]
            out = {"output_ids": [9] * new, "meta_info": {
                "input_token_logprobs": entries, "input_top_logprobs": tops}}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server() -> Iterator[Recorder]:
    srv = Recorder()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_the_rechunked_arm_sends_the_prefix_as_a_cached_turn_and_scores_both_pieces(
        server: Recorder) -> None:
    positions = tuple(range(2, len(IDS)))
    cold = DriftRecord("d0", IDS, 1, positions, tuple(logprob(p) for p in positions),
                       tuple(((IDS[p], logprob(p)), (7, -5.0)) for p in positions), 30)
    arms = null_arms(ProbeClient(server.url), SPEC, [cold], [])
    assert [a for a, _ in arms] == [CONCURRENT_ARM, RECHUNK_ARM, RECHUNK_ARM, RECHUNK_ARM]
    generate = [b for path, b in server.bodies if path == "/generate"]
    flushes = [path for path, _ in server.bodies if path == "/flush_cache"]
    assert len(flushes) == 4  # once before the concurrent arm, once before each re-chunk
    for q, split in zip((1, 2, 3), (11, 21, 31), strict=True):
        prefix, rest = generate[2 * q - 1], generate[2 * q]
        # the prefix: an ordinary request of its own (one new token, so SGLang finishes it and
        # caches its prompt), scored from the window's start
        assert prefix["input_ids"] == list(IDS[:split])
        assert prefix["sampling_params"]["max_new_tokens"] == 1
        assert prefix["logprob_start_len"] == 1 and prefix["return_logprob"]
        # then the whole transcript, scored from the split (the cached prefix's end)
        assert rest["input_ids"] == list(IDS) and rest["logprob_start_len"] == split
        assert rest["sampling_params"]["max_new_tokens"] == 0
        rec = arms[q][1]
        assert rec.case_id == "d0" and rec.input_ids == IDS and rec.start == 1
        assert rec.answer_start == 30
        assert rec.positions == tuple(p for p in positions if p != split)
        assert rec.token_logprobs == tuple(logprob(p) for p in rec.positions)
        assert [t[0][0] for t in rec.top] == [IDS[p] for p in rec.positions]
