"""The PD transfer: the prefill server's bootstrap port, two backends, and the decode side.

As in SGLang (`disaggregation/common/conn.py`, `mooncake/conn.py`, `nixl/conn.py`): the router
gives a request to both servers with `bootstrap_host`, `bootstrap_port` and `bootstrap_room`.
The decode server connects to the prefill server's bootstrap port and registers for the room
with its backend (SGLang's decode KV receiver sends its destination over ZMQ); once the room's
prefill is done the prefill server writes the request's buffers to it and reports the status.
Here the two servers are processes of one machine and the transport is TCP on loopback (no
RDMA); the backends keep SGLang's names and differ in how they move the buffers:

- `mooncake` (`MooncakeKVManager`): one block write per KV buffer (`send_kv`), then the state
  buffers (`maybe_send_extra`), then the metadata (aux) and the status.
- `nixl` (`NixlKVManager`): one transfer of a prepared descriptor list over every buffer, then
  a notification carrying the metadata.

`state-not-sent` (sglang PR #24878) is a fault of the `mooncake` backend only, where it acted:
its `maybe_send_extra` had no branch for DeepSeek-V4's state type and returned 0, so the SWA,
compress-state and indexer compress-state buffers were never sent while the KV and the metadata
were, and the decode server read whatever its slot held (slots.py). Under `nixl` it changes
nothing. Each transfer is measured (bytes per kind, seconds) on both sides (`TransferStats`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsv4bisect.errors import EngineError
from dsv4bisect.patching.transfer_faults import check_fault
from dsv4bisect.reference.generation import Bootstrap
from dsv4bisect.reference.pd.state import AUX, CATEGORIES, KV, STATE, Header, Payload
from dsv4bisect.reference.pd.wire import (
    WireError,
    recv_frame,
    send_frame,
    tensor_bytes,
    tensor_from,
)

log = logging.getLogger(__name__)

BACKENDS = ("mooncake", "nixl")  # SGLang's --disaggregation-transfer-backend names
STATE_NOT_SENT = "state-not-sent"  # patching/transfer_faults.py: citations and sizes
STALE_SLOT = "stale-slot"
# SGLang's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT and _WAITING_TIMEOUT defaults (seconds;
# srt/environ.py, 0.5.13)
BOOTSTRAP_TIMEOUT_S = 300.0
WAITING_TIMEOUT_S = 300.0
LISTEN_BACKLOG = 128


class TransferFailed(Exception):
    """The transfer of a room did not complete (the peer failed, left, or timed out)."""


def check_backend(backend: str, fault: str | None) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown transfer backend {backend!r} (choose {', '.join(BACKENDS)})")
    check_fault(fault)


@dataclass
class TransferStats:
    """Running totals of one server's transfers (`/server_info`: `pd_transfer_*`)."""

    role: str
    requests: int = 0
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        (*CATEGORIES, "framing"), 0))
    seconds: float = 0.0
    wait_seconds: float = 0.0
    last: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, record: dict[str, Any]) -> None:
        b = record["bytes"]
        log.info("%s transfer room %s (%s, %d tokens): kv %d B, state %d B, aux %d B, framing "
                 "%d B in %.2f ms%s", self.role, record["room"], record["backend"],
                 record.get("n_tokens", 0), b.get("kv", 0), b.get("state", 0), b.get("aux", 0),
                 b.get("framing", 0), 1e3 * float(record["seconds"]),
                 f" after waiting {1e3 * record['wait_seconds']:.0f} ms"
                 if "wait_seconds" in record else "")
        with self._lock:
            self.requests += 1
            for key in self.bytes:
                self.bytes[key] += int(record["bytes"].get(key, 0))
            self.seconds += float(record["seconds"])
            self.wait_seconds += float(record.get("wait_seconds", 0.0))
            self.last = record

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            total = sum(self.bytes.values())
            return {"pd_transfer_requests": self.requests,
                    "pd_transfer_bytes": dict(self.bytes) | {"total": total},
                    "pd_transfer_seconds": round(self.seconds, 6),
                    "pd_transfer_wait_seconds": round(self.wait_seconds, 6),
                    "pd_transfer_last": dict(self.last)}


# ---- the backends: how the prefill side puts a payload on the connection -------------------

def _buffer_frame(name: str, category: str, tensor: Any) -> tuple[dict[str, Any], bytes]:
    return ({"kind": "block", "name": name, "category": category,
             "shape": list(tensor.shape)}, tensor_bytes(tensor))


def _send_mooncake(sock: socket.socket, payload: Payload, fault: str | None) -> dict[str, int]:
    sent = dict.fromkeys((*CATEGORIES, "framing"), 0)

    def put(header: dict[str, Any], data: bytes, category: str) -> None:
        n = send_frame(sock, header, data)
        sent[category] += len(data)
        sent["framing"] += n - len(data)

    for name, tensor in payload.buffers[KV].items():  # send_kv: a block write per buffer
        put(*_buffer_frame(name, KV, tensor), KV)
    if fault != STATE_NOT_SENT:  # maybe_send_extra: the DeepSeek-V4 state pools
        for name, tensor in payload.buffers[STATE].items():
            put(*_buffer_frame(name, STATE, tensor), STATE)
    for name, tensor in payload.buffers[AUX].items():
        put(*_buffer_frame(name, AUX, tensor), AUX)
    put({"kind": "status", "status": "success", "header": payload.header.to_json()}, b"", AUX)
    return sent


def _send_nixl(sock: socket.socket, payload: Payload, fault: str | None) -> dict[str, int]:
    del fault  # no NIXL fault is modelled: PR #24878's bug was Mooncake's
    sent = dict.fromkeys((*CATEGORIES, "framing"), 0)
    descs, chunks, offset = [], [], 0
    for category in CATEGORIES:
        for name, tensor in payload.buffers[category].items():
            data = tensor_bytes(tensor)
            descs.append({"name": name, "category": category, "shape": list(tensor.shape),
                          "offset": offset, "nbytes": len(data)})
            chunks.append(data)
            sent[category] += len(data)
            offset += len(data)
    blob = b"".join(chunks)
    n = send_frame(sock, {"kind": "xfer", "descs": descs}, blob)
    sent["framing"] += n - len(blob)
    sent["framing"] += send_frame(sock, {"kind": "notif", "status": "success",
                                         "header": payload.header.to_json()})
    return sent


SENDERS: dict[str, Callable[[socket.socket, Payload, str | None], dict[str, int]]] = {
    "mooncake": _send_mooncake, "nixl": _send_nixl}


# ---- the prefill side ---------------------------------------------------------------------

@dataclass
class _Room:
    conn: socket.socket | None = None
    registered_at: float = 0.0
    failed: str | None = None


class BootstrapServer:
    """The prefill server's bootstrap port: decode servers register for rooms here, and
    `send` writes a room's payload to the decode server that registered for it."""

    def __init__(self, host: str, port: int, backend: str, fault: str | None) -> None:
        check_backend(backend, fault)
        self.backend, self.fault = backend, fault
        self.stats = TransferStats("prefill")
        self._rooms: dict[int, _Room] = {}
        self._cond = threading.Condition()
        self._closed = False
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                        flags=socket.AI_PASSIVE)[0][0]
            self._listener = socket.create_server((host, port), family=family,
                                                  backlog=LISTEN_BACKLOG)
        except OSError as exc:
            raise EngineError(f"cannot bind the bootstrap port {host}:{port}: {exc.strerror}",
                              "choose another --disaggregation-bootstrap-port or stop the "
                              "process holding it") from None
        self._thread = threading.Thread(target=self._accept, name="pd-bootstrap", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def close(self) -> None:
        with self._cond:
            self._closed = True
            rooms, self._rooms = self._rooms, {}
            self._cond.notify_all()
        for room in rooms.values():
            if room.conn is not None:
                room.conn.close()
        self._listener.close()

    def send(self, room: int, payload: Payload, cancelled: Callable[[], bool]) -> dict[str, Any]:
        """Wait for the decode server of `room`, send `payload` with this server's backend;
        returns the transfer's record (bytes per kind, seconds)."""
        deadline = time.monotonic() + BOOTSTRAP_TIMEOUT_S
        with self._cond:
            entry = self._rooms.setdefault(room, _Room())
            while entry.conn is None:
                if self._closed or cancelled():
                    raise TransferFailed("the prefill server stopped before the decode "
                                         "server registered")
                if time.monotonic() > deadline:
                    self._rooms.pop(room, None)
                    raise TransferFailed(f"no decode server registered for room {room} in "
                                         f"{BOOTSTRAP_TIMEOUT_S:.0f} s")
                self._cond.wait(0.05)
            self._rooms.pop(room, None)
        conn = entry.conn
        t0 = time.perf_counter()
        try:
            sent = SENDERS[self.backend](conn, payload, self.fault)
        except OSError as exc:
            raise TransferFailed(f"room {room}: the decode server went away ({exc})") from None
        finally:
            conn.close()
        record = {"room": room, "backend": self.backend, "bytes": sent,
                  "seconds": time.perf_counter() - t0, "n_tokens": payload.header.n_tokens,
                  "state_sent": not (self.backend == "mooncake"
                                     and self.fault == STATE_NOT_SENT)}
        self.stats.add(record)
        return record

    def fail(self, room: int, reason: str) -> None:
        """The room's prefill failed: tell its decode server (now, or when it registers)."""
        with self._cond:
            entry = self._rooms.pop(room, None)
            if entry is None or entry.conn is None:
                self._rooms[room] = _Room(failed=reason, registered_at=time.monotonic())
                return
        _refuse(entry.conn, reason)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._register, args=(conn,), name="pd-register",
                             daemon=True).start()

    def _register(self, conn: socket.socket) -> None:
        try:
            header, _, _ = recv_frame(conn, time.monotonic() + 30.0, lambda: self._closed)
        except WireError as exc:
            log.warning("a decode server's registration failed: %s", exc)
            conn.close()
            return
        room, backend = header.get("room"), header.get("backend")
        if header.get("kind") != "register" or not isinstance(room, int):
            _refuse(conn, "expected a registration with an integer room")
            return
        if backend != self.backend:
            _refuse(conn, f"the prefill server transfers with {self.backend}, the decode "
                    f"server with {backend}: run both with the same "
                    "--disaggregation-transfer-backend")
            return
        with self._cond:
            self._expire()
            entry = self._rooms.setdefault(room, _Room())
            if entry.failed is not None:
                self._rooms.pop(room, None)
                reason = entry.failed
            else:
                entry.conn, entry.registered_at, reason = conn, time.monotonic(), None
                self._cond.notify_all()
        if reason is not None:
            _refuse(conn, reason)

    def _expire(self) -> None:
        """Under the lock: drop rooms nobody sent to or claimed within the timeout."""
        now = time.monotonic()
        for room, entry in list(self._rooms.items()):
            if entry.registered_at and now - entry.registered_at > BOOTSTRAP_TIMEOUT_S:
                del self._rooms[room]
                if entry.conn is not None:
                    entry.conn.close()


def _refuse(conn: socket.socket, reason: str) -> None:
    try:
        send_frame(conn, {"kind": "status", "status": "failed", "error": reason})
    except OSError:
        pass
    finally:
        conn.close()


# ---- the decode side ------------------------------------------------------------------------

def receive(bootstrap: Bootstrap, backend: str, cancelled: Callable[[], bool]
            ) -> tuple[Payload, dict[str, Any]]:
    """Register for `bootstrap.room` at the prefill server and read its payload; returns it
    with the transfer's record (bytes per kind, seconds waiting and transferring)."""
    deadline = time.monotonic() + WAITING_TIMEOUT_S
    t0 = time.perf_counter()
    try:
        sock = socket.create_connection((bootstrap.host, bootstrap.port), timeout=30.0)
    except OSError as exc:
        raise TransferFailed(f"cannot reach the prefill server's bootstrap port "
                             f"{bootstrap.host}:{bootstrap.port}: {exc}") from None
    got = dict.fromkeys((*CATEGORIES, "framing"), 0)
    buffers: dict[str, dict[str, Any]] = {c: {} for c in CATEGORIES}
    first_byte: float | None = None
    try:
        send_frame(sock, {"kind": "register", "room": bootstrap.room, "backend": backend})
        while True:
            header, data, n = recv_frame(sock, deadline, cancelled)
            if first_byte is None:
                first_byte = time.perf_counter()
            got["framing"] += n - len(data)
            kind = header.get("kind")
            if kind in ("status", "notif"):
                if header.get("status") != "success":
                    raise TransferFailed(f"room {bootstrap.room}: "
                                         f"{header.get('error') or 'the transfer failed'}")
                meta = Header.from_json(header["header"])
                break
            if kind == "block" and backend == "mooncake":
                _file(buffers, got, header, data)
            elif kind == "xfer" and backend == "nixl":
                for desc in header.get("descs") or []:
                    at, size = int(desc["offset"]), int(desc["nbytes"])
                    _file(buffers, got, desc, data[at : at + size])
            else:
                raise TransferFailed(f"unexpected frame {kind!r} on a {backend} transfer")
    except WireError as exc:
        raise TransferFailed(f"room {bootstrap.room}: {exc}") from None
    finally:
        sock.close()
    done = time.perf_counter()
    start = first_byte if first_byte is not None else done
    payload = Payload(meta, buffers)
    record = {"room": bootstrap.room, "backend": backend, "bytes": got,
              "seconds": done - start, "wait_seconds": start - t0, "n_tokens": meta.n_tokens,
              "state_received": bool(buffers[STATE])}
    return payload, record


def _file(buffers: dict[str, dict[str, Any]], got: dict[str, int], desc: dict[str, Any],
          data: bytes) -> None:
    category, name = desc.get("category"), desc.get("name")
    if category not in CATEGORIES or not isinstance(name, str):
        raise TransferFailed(f"a buffer without a known kind: {str(desc)[:200]}")
    buffers[category][name] = tensor_from(data, list(desc.get("shape") or []))
    got[category] += len(data)
