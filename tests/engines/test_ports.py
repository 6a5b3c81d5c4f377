"""Who holds a port (/proc/net/tcp + /proc/PID/fd), with real sockets and processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from dsv4bisect.engines import ports, procfs

pytestmark = pytest.mark.skipif(not procfs.available(), reason="needs Linux /proc")


def test_a_listening_socket_is_named_by_its_owner_pid_and_command_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        holder = ports.port_holder("127.0.0.1", port)
        assert holder is not None and holder.pid == os.getpid()
        assert holder.cmdline and "python" in holder.cmdline
        assert f"port {port} is held by PID {os.getpid()}" in holder.describe()
        # a wildcard bind is reached from the loopback address too
        assert ports.port_holder("0.0.0.0", port) is not None
    assert ports.port_holder("127.0.0.1", port) is None  # closed: free again


def test_a_wildcard_listener_holds_the_loopback_port() -> None:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        (lst,) = ports.listeners("127.0.0.1", port) or []
        assert lst.address == "0.0.0.0"
        assert ports.owners(lst.inode, among={os.getpid()}) == [os.getpid()]
        assert ports.owners(lst.inode, among={1}) == []


def test_a_bound_socket_that_does_not_listen_still_holds_the_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        holder = ports.port_holder("127.0.0.1", port)
        assert holder is not None and holder.pid is None
        assert "held by another user's process" in holder.describe()


def test_a_holders_secret_arguments_are_not_printed() -> None:
    code = "import socket,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); " \
           "print(s.getsockname()[1], flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, "--api-key", "tok-AAAA-1111"],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())  # type: ignore[union-attr]
        holder = ports.port_holder("127.0.0.1", port)
        assert holder is not None and holder.pid == proc.pid
        assert "tok-AAAA-1111" not in holder.describe() and "--api-key ***" in holder.describe()
    finally:
        proc.kill()
        proc.wait()


def test_local_and_remote_hosts() -> None:
    assert ports.is_local_host("127.0.0.1") and ports.is_local_host("localhost")
    assert ports.is_local_host("0.0.0.0")
    assert not ports.is_local_host("192.0.2.1")  # TEST-NET-1: never an address of this machine
    assert not ports.is_local_host("no-such-host.invalid")


def test_proc_stat_gives_a_stable_identity() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    try:
        st = procfs.stat(proc.pid)
        assert st is not None and st.pgrp == proc.pid and st.session == proc.pid
        assert procfs.same_process(proc.pid, st.start_time)
        assert not procfs.same_process(proc.pid, st.start_time + 1)  # a reused PID
        assert proc.pid in procfs.descendants_of({proc.pid})
        assert procfs.group_members(proc.pid) == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while procfs.stat(proc.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not procfs.same_process(proc.pid, st.start_time)
