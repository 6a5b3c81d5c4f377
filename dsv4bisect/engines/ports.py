"""Who holds a TCP port: the one implementation behind the launcher's checks (and `doctor`).

Linux maps a listening socket to its owner in two steps: `/proc/net/tcp{,6}` gives the socket's
inode for a local (address, port), and `/proc/PID/fd/*` links name the inodes each process holds.
The launcher uses this twice (docs/run.md, "Whose server answers"):

* before a launch, a fixed port that is already held is CANNOT_TEST, with the holder named;
* after readiness, before any probe, every socket listening on an engine's port must belong to
  the processes it launched — otherwise the answers came from someone else's server.

A host that is not an address of this machine (a `command` engine serving from elsewhere) cannot
be checked this way: `is_local_host` says so and the caller records the launch as unverified.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from dsv4bisect.engines import procfs

LISTEN = "0A"  # TCP state code in /proc/net/tcp
TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


@dataclass(frozen=True)
class Holder:
    """The process holding a port (pid None: its fds cannot be read, e.g. another user's)."""

    port: int
    pid: int | None
    uid: int | None
    cmdline: str | None

    def describe(self) -> str:
        if self.pid is None:
            who = f" (uid {self.uid})" if self.uid is not None else ""
            return f"port {self.port} is held by another user's process{who}"
        cmd = f" ({self.cmdline})" if self.cmdline else ""
        return f"port {self.port} is held by PID {self.pid}{cmd}"


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    inode: int
    uid: int


def listeners(host: str, port: int, *, binding: bool = False) -> list[Listener] | None:
    """Sockets listening on `port` that matter for `host` (None without /proc/net).

    For a connection (the default): the ones a client of `host:port` reaches — Linux hands it
    to a listener on that exact address when there is one, else to a wildcard listener
    (0.0.0.0, or [::], dual-stack). A client of 0.0.0.0 reaches the loopback address.
    With `binding`: every listener that stops us from binding `host:port` (exact or wildcard
    ones; any address when `host` is itself the wildcard).
    """
    tables = [t for t in TCP_TABLES if t.is_file()]
    if not tables:
        return None
    targets = _addresses(host)
    found: list[tuple[Listener, ipaddress.IPv4Address | ipaddress.IPv6Address]] = []
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10 or parts[3] != LISTEN:
                continue
            addr_hex, port_hex = parts[1].split(":")
            if int(port_hex, 16) != port:
                continue
            addr = _decode(addr_hex)
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                addr = addr.ipv4_mapped
            found.append((Listener(str(addr), port, int(parts[9]), int(parts[7])), addr))
    if binding:
        wild = any(t.is_unspecified for t in targets)
        return [lst for lst, a in found if wild or a.is_unspecified or a in targets]
    reach = {_loopback(t) if t.is_unspecified else t for t in targets}
    exact = [lst for lst, a in found if a in reach]
    return exact or [lst for lst, a in found if a.is_unspecified]


def owners(inode: int, among: set[int] | None = None) -> list[int]:
    """PIDs whose open fds include socket `inode` (only `among`, when given)."""
    candidates = sorted(among) if among is not None else list(procfs.pids())
    return [pid for pid in candidates if inode in (procfs.socket_inodes(pid) or ())]


def holder_of(listener: Listener) -> Holder:
    pids = owners(listener.inode)
    if not pids:
        return Holder(listener.port, None, listener.uid, None)
    pid = min(pids)  # the oldest sharer is usually the one that bound it
    return Holder(listener.port, pid, procfs.uid_of(pid), procfs.cmdline(pid))


def port_holder(host: str, port: int) -> Holder | None:
    """The holder of `host:port`, or None when the port is free for us to bind.

    A port that cannot be bound but has no listener we can see (bound, not listening) is held
    by an unnamed process: a Holder without PID or uid.
    """
    found = listeners(host, port, binding=True) or []
    if found:
        return holder_of(found[0])
    if bindable(host, port):
        return None
    return Holder(port, None, None, None)


def first_held(host: str, ports: Iterable[tuple[str, int]]) -> tuple[str, Holder] | None:
    """The first of `(label, port)` someone holds on this machine's `host`, with its holder;
    None when all are free or `host` is not this machine (its ports are not ours to check)."""
    if not is_local_host(host):
        return None
    for label, port in ports:
        holder = port_holder(host, port)
        if holder is not None:
            return label, holder
    return None


def bindable(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def is_local_host(host: str) -> bool:
    """True when `host` resolves to an address of this machine (loopback, wildcard, or one of
    its interfaces: binding it succeeds)."""
    for addr in _addresses(host):
        if addr.is_loopback or addr.is_unspecified:
            return True
        family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((str(addr), 0))
                return True
            except OSError:
                continue
    return False


def _addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    out = []
    for info in infos:
        try:
            out.append(ipaddress.ip_address(str(info[4][0]).split("%")[0]))
        except ValueError:
            continue
    return out


def _loopback(addr: ipaddress.IPv4Address | ipaddress.IPv6Address
              ) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address("::1" if addr.version == 6 else "127.0.0.1")


def _decode(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_addr)
    if sys.byteorder == "big":
        return ipaddress.ip_address(raw)
    # /proc prints each 32-bit word in host byte order (little-endian on x86 and arm64).
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)
