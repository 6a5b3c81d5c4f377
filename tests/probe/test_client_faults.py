"""Client errors are clear and bounded in time (a fake server injects the faults).

The fake server here exists only for faults a real server cannot be made to produce on demand:
HTTP 500s, malformed JSON, responses of the wrong shape, and a hang.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dsv4bisect.errors import ProbeError
from dsv4bisect.probe.client import ProbeClient, ServerUnreachable
from dsv4bisect.probe.runner import collect
from dsv4bisect.probe.spec import tier_spec

MODELS = {"data": [{"id": "fake", "max_model_len": 4096}]}


class FaultServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.mode = mode
        self.hits: list[str] = []

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a hung handler writing to a closed socket after the test is expected

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: FaultServer

    def log_message(self, *args: object) -> None:  # keep test output clean
        pass

    def _send(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _reply(self) -> None:
        self.server.hits.append(self.path)
        if self.path == "/v1/models":
            return self._send(200, json.dumps(MODELS))
        mode = self.server.mode
        if mode == "500":
            auth = self.headers.get("Authorization", "")
            return self._send(500, json.dumps({"error": f"boom; you sent {auth}"}))
        if mode == "malformed":
            return self._send(200, "{not json at all")
        if mode == "wrong-shape":
            return self._send(200, json.dumps({"choices": [], "usage": {}, "tokens": "x"}))
        if mode == "hang":
            time.sleep(5)
        return self._send(404, json.dumps({"error": "not found"}))

    def do_GET(self) -> None:
        self._reply()

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self._reply()


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[FaultServer]:
    srv = FaultServer(request.param)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("server", ["500"], indirect=True)
def test_500_is_retried_then_reported_without_the_key(server: FaultServer) -> None:
    client = ProbeClient(server.url, api_key="sk-secret-123", retries=2, backoff_s=0.01)
    with pytest.raises(ProbeError) as exc:
        client.chat(MESSAGES, max_tokens=4)
    assert "HTTP 500" in exc.value.message and "/v1/chat/completions" in exc.value.message
    assert "sk-secret-123" not in exc.value.message and "***" in exc.value.message
    assert server.hits.count("/v1/chat/completions") == 3  # 1 + 2 retries


@pytest.mark.parametrize("server", ["malformed"], indirect=True)
def test_malformed_json_is_a_probe_error_with_an_excerpt(server: FaultServer) -> None:
    with pytest.raises(ProbeError, match=r"malformed JSON response: \{not json at all"):
        ProbeClient(server.url).chat(MESSAGES, max_tokens=4)


@pytest.mark.parametrize("server", ["wrong-shape"], indirect=True)
def test_wrong_shape_is_named(server: FaultServer) -> None:
    client = ProbeClient(server.url)
    with pytest.raises(ProbeError, match="malformed response"):
        client.chat(MESSAGES, max_tokens=4)
    with pytest.raises(ProbeError, match="no integer `tokens`"):
        client.tokenize_messages(MESSAGES)


@pytest.mark.parametrize("server", ["hang"], indirect=True)
def test_hang_fails_within_the_timeout(server: FaultServer) -> None:
    t0 = time.perf_counter()
    with pytest.raises(ProbeError, match="no response within 0.5 s"):
        ProbeClient(server.url, timeout_s=0.5, retries=3).chat(MESSAGES, max_tokens=4)
    assert time.perf_counter() - t0 < 2.0  # a read timeout is not retried


@pytest.mark.parametrize("server", ["hang"], indirect=True)
def test_collect_against_a_hung_server_is_bounded(server: FaultServer) -> None:
    spec = tier_spec("ci").replace(timeout_s=0.5)
    t0 = time.perf_counter()
    with pytest.raises(ProbeError, match="no response"):
        collect(server.url, spec)
    assert time.perf_counter() - t0 < 3.0


def test_unreachable_server() -> None:
    client = ProbeClient("http://127.0.0.1:9", retries=1, backoff_s=0.01, timeout_s=1)
    with pytest.raises(ServerUnreachable, match="cannot connect .* after 2 attempts"):
        client.describe()
