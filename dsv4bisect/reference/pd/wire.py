"""Frames on a PD transfer connection (TCP): a 4-byte big-endian header length, a JSON header
carrying `nbytes`, then that many payload bytes; and float32 tensors as raw bytes.

A reader never trusts a length beyond its bound, and gives up at a deadline or when its caller
is cancelled (a socket timeout of POLL_S between checks), so a peer that stops sending cannot
hold a request thread forever."""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import torch

MAX_HEADER_BYTES = 1 << 20
MAX_PAYLOAD_BYTES = 1 << 34  # 16 GiB: far above a tiny model's state, a bound all the same
POLL_S = 0.2
_LEN = struct.Struct("!I")


class WireError(Exception):
    """The peer broke the protocol, went away, or did not answer in time."""


def send_frame(sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> int:
    """Send one frame; returns the bytes put on the wire."""
    head = json.dumps({**header, "nbytes": len(payload)}, separators=(",", ":")).encode()
    sock.sendall(_LEN.pack(len(head)) + head)
    if payload:
        sock.sendall(payload)
    return _LEN.size + len(head) + len(payload)


def recv_frame(sock: socket.socket, deadline: float, cancelled: Callable[[], bool]
               ) -> tuple[dict[str, Any], bytes, int]:
    """(header, payload, bytes read) of the next frame."""
    (size,) = _LEN.unpack(_read(sock, _LEN.size, deadline, cancelled))
    if size > MAX_HEADER_BYTES:
        raise WireError(f"a frame header of {size} bytes (at most {MAX_HEADER_BYTES})")
    try:
        header = json.loads(_read(sock, size, deadline, cancelled))
    except ValueError as exc:
        raise WireError(f"a frame header that is not JSON: {exc}") from None
    nbytes = header.get("nbytes") if isinstance(header, dict) else None
    if not isinstance(nbytes, int) or not 0 <= nbytes <= MAX_PAYLOAD_BYTES:
        raise WireError(f"a frame without a valid `nbytes`: {str(header)[:200]}")
    payload = _read(sock, nbytes, deadline, cancelled) if nbytes else b""
    return header, payload, _LEN.size + size + nbytes


def _read(sock: socket.socket, n: int, deadline: float, cancelled: Callable[[], bool]) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        if cancelled():
            raise WireError("cancelled")
        left = deadline - time.monotonic()
        if left <= 0:
            raise WireError("timed out waiting for the peer")
        sock.settimeout(min(POLL_S, left))
        try:
            k = sock.recv_into(view[got:], n - got)
        except TimeoutError:
            continue
        except OSError as exc:
            raise WireError(f"connection failed: {exc}") from None
        if k == 0:
            raise WireError("the peer closed the connection")
        got += k
    return bytes(buf)


def tensor_bytes(t: torch.Tensor) -> bytes:
    """A float32 tensor's values as raw bytes (C order)."""
    return t.detach().to(torch.float32).contiguous().cpu().numpy().tobytes()


def tensor_from(data: bytes, shape: list[int]) -> torch.Tensor:
    """The float32 tensor of `shape` whose raw bytes are `data`."""
    expected = 4 * int(torch.Size(shape).numel())
    if len(data) != expected:
        raise WireError(f"{len(data)} bytes for a float32 tensor of shape {shape}")
    if not data:
        return torch.empty(shape, dtype=torch.float32)
    return torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(shape)
