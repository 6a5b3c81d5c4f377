"""A hostile or broken server gives a verdict that is real evidence or none (issue 30, items 2, 9
and 11). A fake server injects what a real one cannot be made to produce on demand: NaN and
Infinity logprobs, wrong-typed numbers, a trickled answer, a body cut short, a bad /server_info.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from dsv4bisect.errors import ProbeError
from dsv4bisect.probe.client import ProbeClient
from dsv4bisect.probe.drift import NON_FINITE, DriftRecord, NonFiniteScores, compare
from dsv4bisect.probe.grid import Case, Cell
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.runner import drift_row, judge
from dsv4bisect.probe.spec import tier_spec

SPEC = tier_spec("smoke")
IDS = (1, 2, 3, 4)


class Fake(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.logprob: Any = -0.1  # what /generate reports for every scored position
        self.server_info: Any = {"compress_ratios": [0, 4, 128]}
        self.max_model_len: Any = 4096
        self.trickle_s: float | None = None  # one body byte every trickle_s seconds
        self.cut_short = False  # announce a longer body than is sent, then stall

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a write to a socket the client shut down at its deadline

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Fake

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, body: str) -> None:
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data) + (100 if self.server.cut_short else 0)))
        self.end_headers()
        if self.server.trickle_s is not None:
            for byte in data:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(self.server.trickle_s)
            return
        self.wfile.write(data)
        self.wfile.flush()
        if self.server.cut_short:
            time.sleep(30)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            return self._send(json.dumps({"data": [{"id": "fake",
                                                    "max_model_len": self.server.max_model_len}]}))
        return self._send(json.dumps(self.server.server_info))

    def do_POST(self) -> None:
        n = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/tokenize":
            return self._send(json.dumps({"tokens": list(IDS[:2])}))
        if self.path == "/generate" and n["sampling_params"]["max_new_tokens"]:
            return self._send(json.dumps({"output_ids": list(IDS[2:]), "meta_info": {}}))
        if self.path == "/generate":
            lp = self.server.logprob
            ids = n["input_ids"][n["logprob_start_len"]:]
            return self._send(json.dumps({"meta_info": {
                "input_token_logprobs": [[None if i == 0 else lp, t] for i, t in enumerate(ids)],
                "input_top_logprobs": [None if i == 0 else [[lp, t], [-3.0, 9]]
                                       for i, t in enumerate(ids)]}}))
        return self._send("{}")


@pytest.fixture
def fake() -> Iterator[Fake]:
    srv = Fake()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _case(case_id: str = "drift/c0/1") -> Case:
    return Case(case_id, Cell("drift", 512, 0.5, 1), 0, 1, 4, (), 4, "", (), 0.5, 4)


# -- item 2: NaN / Infinity logprobs -----------------------------------------------------------

@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logprobs_are_their_own_error_not_agreement(fake: Fake, value: float) -> None:
    fake.logprob = value  # json.dumps writes the NaN / Infinity / -Infinity literals
    with pytest.raises(NonFiniteScores, match="non-finite logprobs"):
        ProbeClient(fake.url).score(IDS, start=1, top_k=2)


@pytest.mark.parametrize("value", ["x", True, [1], {"a": 1}])
def test_wrong_typed_logprobs_are_malformed(fake: Fake, value: Any) -> None:
    fake.logprob = value
    with pytest.raises(ProbeError, match="malformed response") as exc:
        ProbeClient(fake.url).score(IDS, start=1, top_k=2)
    assert not isinstance(exc.value, NonFiniteScores)


def test_nan_records_never_compare_as_agreement() -> None:
    good = DriftRecord("d", IDS, 1, (1, 2, 3), (-0.1,) * 3, (((7, -0.1), (8, -3.0)),) * 3)
    nan = DriftRecord("d", IDS, 1, (1, 2, 3), (float("nan"),) * 3,
                      (((7, float("nan")), (8, float("nan"))),) * 3)
    with pytest.raises(NonFiniteScores):
        compare(good, nan)
    with pytest.raises(NonFiniteScores):
        compare(nan, good)


def _drift_run(fake: Fake, value: float, ref: DriftRecord | None) -> tuple[ProbeRun, Any]:
    fake.logprob = value
    row, rec = drift_row(ProbeClient(fake.url), SPEC, _case(), ref)
    return ProbeRun(SPEC, fake.url, {}, (), (row,), (rec,) if rec else ()), rec


def test_nan_from_the_candidate_is_a_fail_with_its_own_signature(fake: Fake) -> None:
    base, ref = _drift_run(fake, -0.1, None)
    assert ref is not None and judge(base, base, base).verdict == "PASS"
    cand, rec = _drift_run(fake, float("nan"), ref)
    assert rec is None and cand.rows[0]["signatures"] == [NON_FINITE]
    v = judge(base, base, cand)
    assert v.verdict == "FAIL" and v.exit_code == 1
    assert "non-finite logprobs" in v.reasons[0] and "sglang#25704" in v.reasons[0]
    assert v.signatures["non_finite"] == ["drift/c0/1"] and v.signatures["hard_fail"]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_from_the_good_end_is_cannot_test(fake: Fake, value: float) -> None:
    base, ref = _drift_run(fake, value, None)
    assert ref is None
    good, _ = _drift_run(fake, -0.1, None)
    for b, r in ((base, good), (good, base)):
        v = judge(b, r, good)
        assert v.verdict == "CANNOT_TEST" and v.exit_code == 125
        assert any("non-finite" in x for x in v.reasons)


def test_infinite_token_counts_are_malformed_not_a_traceback(fake: Fake) -> None:
    class Inf(Handler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send('{"choices": [{"message": {"content": "x"}}], '
                       '"usage": {"prompt_tokens": Infinity}}')
    fake.RequestHandlerClass = Inf
    with pytest.raises(ProbeError, match="malformed response"):
        ProbeClient(fake.url).chat([{"role": "user", "content": "hi"}], max_tokens=2)


# -- item 9: a wall-clock deadline per request -------------------------------------------------

def test_a_trickled_answer_ends_at_the_deadline(fake: Fake) -> None:
    fake.trickle_s = 0.4  # each byte well inside the 1 s per-read timeout, the body never ends
    t0 = time.monotonic()
    with pytest.raises(ProbeError, match="no response within 1 s"):
        ProbeClient(fake.url, timeout_s=1.0).request("GET", "/server_info")
    assert time.monotonic() - t0 < 10  # generous: the deadline is 1 s, a trickle takes ~60 s


def test_a_body_cut_short_is_not_retried(fake: Fake) -> None:
    fake.cut_short = True
    hits = []
    original = Handler.do_GET

    class Counting(Handler):
        def do_GET(self) -> None:
            hits.append(self.path)
            original(self)
    fake.RequestHandlerClass = Counting
    with pytest.raises(ProbeError, match="no response within 1 s"):
        ProbeClient(fake.url, timeout_s=1.0, retries=3, backoff_s=0.01).request(
            "GET", "/server_info")
    assert hits == ["/server_info"]


def test_the_deadline_leaves_the_client_usable(fake: Fake) -> None:
    client = ProbeClient(fake.url, timeout_s=1.0)
    fake.trickle_s = 0.4
    with pytest.raises(ProbeError):
        client.request("GET", "/server_info")
    fake.trickle_s = None
    assert client.request("GET", "/server_info") == fake.server_info


# -- item 11: /server_info validated -----------------------------------------------------------

@pytest.mark.parametrize("info", [{"compress_ratios": ["x", None]}, {"compress_ratios": "4"},
                                  {"compress_ratios": [4, -1]}, {"compress_ratios": [True]},
                                  {"sliding_window": 0}, {"sliding_window": "128"},
                                  {"config": {"sliding_window": True}},
                                  ["not", "an", "object"]])
def test_bad_compress_ratios_are_refused(fake: Fake, info: Any) -> None:
    fake.server_info = info
    with pytest.raises(ProbeError, match="malformed response"):
        ProbeClient(fake.url).describe()


@pytest.mark.parametrize("length", [-5, 0, 10 ** 30, "4096", 4096.0, True])
def test_bad_max_model_len_is_refused(fake: Fake, length: Any) -> None:
    fake.max_model_len = length
    with pytest.raises(ProbeError, match="max_model_len"):
        ProbeClient(fake.url).describe()


def test_a_sound_server_info_is_read(fake: Fake) -> None:
    info = ProbeClient(fake.url).describe()
    assert info.max_model_len == 4096 and info.compress_ratios == (0, 4, 128)
    assert info.sliding_window is None  # not reported: the grid uses DeepSeek-V4's 128
    fake.server_info = {"compress_ratios": [0, 4, 16], "config": {"sliding_window": 32}}
    assert ProbeClient(fake.url).describe().sliding_window == 32


def test_nan_in_a_sequential_trial_is_a_fail(fake: Fake) -> None:
    from dsv4bisect.probe.sequential_run import run_sequential

    good, ref = _drift_run(fake, -0.1, None)
    ends = ProbeRun(SPEC, fake.url, {}, (_case(),), good.rows, good.drift)
    fake.logprob = float("nan")
    result = run_sequential(fake.url, ends, ends, ends, false_fail=0.05, false_pass=0.05)
    assert result.verdict == "FAIL" and result.decision.decided_by == "signatures"
    assert "non-finite logprobs" in result.decision.reasons[0]
    assert result.run.rows[0]["signatures"] == [NON_FINITE] and not result.run.drift
