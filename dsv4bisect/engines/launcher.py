"""Start the processes of an `EngineConfig`, wait until they are ready, stop them all.

Each process runs in its own process group (session) with its own log file; readiness is a GET
on its `ready_path` that answers 200, within the profile's startup timeout. A process that exits
before it is ready is a crash (`EngineCrashed`, with the last lines of its log); a timeout without
a crash, or a port held by someone else, is infrastructure (`EngineError`, exit 125). `stop()`
sends SIGTERM to every group, waits a grace period, then SIGKILLs, and returns once every member
of every group is gone (bounded) — on normal exit, exceptions, Ctrl-C and SIGTERM alike, so no
engine is left holding a port or a GPU.

Whose server answers (docs/run.md): a fixed port already held before launch is `PortTaken` (125,
the holder named); once a process answers its ready path, every socket listening on its port
must belong to the processes this launch started (`ports.py`), else the answers came from a
foreign server: `PortTaken` again, before any probe. A host that is not this machine cannot be
checked: the launch is then `verified = False` (its baseline is not cached).
Every spawned group is recorded in `engines.json` (`groups.py`) so that a `kill -9`ed owner's
engines can be stopped by the next run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import requests

from dsv4bisect import env as envvars
from dsv4bisect.config.engine_config import EngineConfig, ProcessSpec
from dsv4bisect.engines import oom, procfs
from dsv4bisect.engines import ports as portcheck
from dsv4bisect.engines.groups import GroupRecord, wait_gone
from dsv4bisect.engines.logs import last_line, redact_file, redact_text, secret_values, tail
from dsv4bisect.errors import EngineError

GRACE_S = 10.0
POLL_S = 0.25
HEALTH_TIMEOUT_S = 30.0  # an idle engine's ready path (SGLang's: one token generated)
EXIT_WAIT_S = 3.0  # after a failed request: how long a dying engine gets to be seen as exited
_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # held back while a spawn is in flight
EventFn = Callable[[str, str, str], None]  # (role, state, last log line)


class EngineCrashed(EngineError):
    """An engine process exited before it was ready, or while it was being probed."""

    def __init__(self, role: str, returncode: int | None, log_tail: str, log_path: Path) -> None:
        super().__init__(
            f"engine process `{role}` exited with code {returncode}\n{log_tail}",
            f"full log: {log_path}",
        )
        self.role, self.returncode, self.log_tail, self.log_path = role, returncode, log_tail, log_path


class EngineKilled(EngineError):
    """An engine ended by a signal dsv4bisect did not send (and not the OOM killer): it was
    stopped from outside, so nothing was measured (exit 125, never evidence)."""

    def __init__(self, role: str, sig: str, log_tail: str, log_path: Path, oom: str) -> None:
        super().__init__(
            f"engine process `{role}` was killed by {sig}, which dsv4bisect did not send "
            f"({oom}): stopped from outside, not a failure of its configuration\n{log_tail}",
            f"another job or an operator ended it; run again (full log: {log_path})")
        self.role, self.signal = role, sig


# Signals an operator, a job scheduler or a terminal sends to stop a process. A process ended
# by one of these that we did not send was stopped from outside. SIGSEGV, SIGBUS, SIGABRT,
# SIGFPE, SIGILL (and any non-zero exit) come from the process itself: crash evidence.
EXTERNAL_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class PortTaken(EngineError):
    """The engine's port is held, or answered, by a process this launch did not start."""

    def __init__(self, role: str, holder: portcheck.Holder, when: str, log: str = "") -> None:
        super().__init__(
            f"`{role}`: {holder.describe()} ({when}); nothing was probed"
            + (f"\n{log}" if log else ""),
            "stop that process, or set engine.port to a free port (or leave it automatic)")
        self.role, self.holder = role, holder


@dataclass
class Running:
    spec: ProcessSpec  # materialized: real ports and paths
    popen: subprocess.Popen[bytes]
    log_path: Path
    url: str
    state: str = "starting"  # starting | ready | exited
    oom_file: Path | None = None  # the memory cgroup's OOM-kill counter (engines/oom.py)
    oom_kills: int | None = None  # its value at spawn


@dataclass
class Launch:
    """Context manager around the processes of one engine configuration."""

    cfg: EngineConfig
    run_dir: Path
    on_event: EventFn | None = None
    procs: list[Running] = field(default_factory=list)
    # None until ready; False when the host is not this machine (or /proc is missing), so the
    # answering server's owner could not be checked.
    verified: bool | None = None
    unverified_why: str | None = None
    _record: GroupRecord | None = None
    _stopping: bool = False
    # every process as soon as Popen returns it: one an interrupt catches before it is in
    # `procs` (its record, its event) is still this launch's to stop
    _spawned: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __enter__(self) -> Launch:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return next(p.url for p in self.procs if p.spec.role == self.cfg.entry_role)

    @property
    def receipts_dir(self) -> Path:
        return self.run_dir / "receipts"

    def start(self) -> None:
        if self.cfg.cannot_start:
            raise EngineError(f"configuration cannot start: {self.cfg.cannot_start}",
                              "enable the required patch, or pick another good end")
        self._check_fixed_ports()
        ports = {p.role: p.port or free_port(self.cfg.host) for p in self.cfg.processes}
        for name in self.cfg.port_names() - ports.keys():  # e.g. a PD bootstrap port
            ports[name] = free_port(self.cfg.host)
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.receipts_dir.mkdir(parents=True, exist_ok=True)
        self._record = GroupRecord(self.run_dir)
        for spec in self.cfg.materialize(ports, sys.executable):
            self.procs.append(self._spawn(spec, ports[spec.role]))

    def _check_fixed_ports(self) -> None:
        """A port set in the profile that someone holds already: CANNOT_TEST, holder named."""
        held = portcheck.first_held(self.cfg.host, [(p.role, p.port) for p in self.cfg.processes
                                                    if p.port is not None])
        if held is not None:
            raise PortTaken(*held, "before launch")

    def _spawn(self, spec: ProcessSpec, port: int) -> Running:
        log_path = self.run_dir / "logs" / f"{spec.role}.log"
        # recorded before the spawn: a kill -9 from here on leaves a record naming the child
        launch = self._record.spawning(spec.role) if self._record is not None else None
        environ = {**os.environ, **safe_path(spec.argv), **dict(spec.env),
                   envvars.ROLE: spec.role, envvars.RECEIPTS: str(self.receipts_dir.resolve()),
                   "PYTHONUNBUFFERED": "1", **({envvars.LAUNCH: launch} if launch else {})}
        try:
            with open(log_path, "ab") as log, _interrupts_after():
                popen = subprocess.Popen(  # argv list, never a shell
                    list(spec.argv), stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, env=environ, start_new_session=True,
                )
                self._spawned.append(popen)
        except OSError:
            if self._record is not None and launch:
                self._record.failed(launch)
            raise
        if self._record is not None:
            self._record.add(spec.role, popen.pid, spec.argv[0] if spec.argv else "", launch)
        self._event(spec.role, "starting", "")
        oom_file = oom.memory_cgroup(popen.pid) or oom.memory_cgroup(os.getpid())
        return Running(spec, popen, log_path, f"http://{self.cfg.host}:{port}", oom_file=oom_file,
                       oom_kills=oom.oom_kills(oom_file))

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        pending = list(self.procs)
        while pending:
            for proc in list(pending):
                self.check_alive(proc)
                if _answers(proc.url + proc.spec.ready_path):
                    self._check_owner(proc)
                    proc.state = "ready"
                    pending.remove(proc)
                    self._event(proc.spec.role, "ready", self._last_line(proc))
                else:
                    self._event(proc.spec.role, "starting", self._last_line(proc))
            if pending and time.monotonic() > deadline:
                stuck = pending[0]
                raise EngineError(
                    f"`{stuck.spec.role}` not ready after {self.cfg.startup_timeout_s:.0f} s "
                    f"(GET {stuck.spec.ready_path})\n{self._tail(stuck, 20)}",
                    f"raise engine.startup_timeout_s, or read {stuck.log_path}",
                )
            if pending:
                time.sleep(POLL_S)

    def health(self) -> str | None:
        """Why this launch cannot serve now, or None: a process exited (killed from outside,
        crashed, or ended cleanly), or one does not answer its ready path. Checked before an
        engine kept up between trials serves again (bisect/trials/engine_pool.py)."""
        ended = self.exited(0.0)
        for p in self.procs:
            if ended is None and not _answers(p.url + p.spec.ready_path, HEALTH_TIMEOUT_S):
                # one still exiting refuses the connection before poll() sees its end
                ended = self.exited(EXIT_WAIT_S)
                if ended is None:
                    return (f"engine process `{p.spec.role}` is alive but did not answer GET "
                            f"{p.spec.ready_path} (within {HEALTH_TIMEOUT_S:.0f} s)")
        return ended.message.splitlines()[0] if ended is not None else None

    def exited(self, wait_s: float) -> EngineError | None:
        """Why a process of this launch ended (`check_alive`'s error), waiting up to `wait_s`
        for a dying one; None while every process is alive."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.check_alive()
            except EngineError as exc:
                return exc
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)

    def _check_owner(self, proc: Running) -> None:
        """The sockets listening on `proc`'s port belong to this launch, or `PortTaken`."""
        if self.verified is False:
            return
        host, port = self.cfg.host, proc.spec.port
        assert port is not None
        if not portcheck.is_local_host(host):
            self.verified, self.unverified_why = False, (
                f"{host} is not an address of this machine: the server answering on port "
                f"{port} cannot be checked to be the one launched")
            return
        found = portcheck.listeners(host, port)
        if found is None:
            self.verified, self.unverified_why = False, (
                "no /proc/net/tcp on this system: the server answering cannot be checked")
            return
        ours = procfs.descendants_of({p.popen.pid for p in self.procs})
        foreign = [lst for lst in found if not portcheck.owners(lst.inode, among=ours)]
        if foreign:
            raise PortTaken(proc.spec.role, portcheck.holder_of(foreign[0]),
                            "it answered in place of the engine that was launched")
        if not found:
            raise EngineError(
                f"`{proc.spec.role}`: GET {proc.url}{proc.spec.ready_path} answered, but no "
                f"socket listens on port {port} of {host} in /proc/net/tcp",
                "is the engine in another network namespace (a container)?")
        self.verified = True

    def check_alive(self, proc: Running | None = None) -> None:
        """Raise if a process died: `EngineError` when its port was taken, else `EngineCrashed`."""
        for p in [proc] if proc else self.procs:
            code = p.popen.poll()
            if code is None or self._stopping:  # alive, or ended by our own stop()
                continue
            p.state = "exited"
            self._event(p.spec.role, "exited", self._tail(p, 1))
            log = self._tail(p, 20)
            if code == 0:  # a clean shutdown nobody here asked for
                raise EngineKilled(p.spec.role, "a request to stop (it exited 0)", log,
                                   p.log_path, "a server exits 0 when told to stop")
            if code < 0 and -code in EXTERNAL_SIGNALS:
                after = oom.oom_kills(p.oom_file)
                if after is None or p.oom_kills is None:
                    why = "no memory cgroup counter to tell an out-of-memory kill apart"
                elif after > p.oom_kills:  # the kernel's OOM killer: the configuration's own
                    raise EngineCrashed(p.spec.role, code, log + "\n(killed by the kernel's "
                                        "out-of-memory killer: the cgroup's oom_kill count rose "
                                        f"from {p.oom_kills} to {after})", p.log_path)
                else:
                    why = f"no out-of-memory kill in its cgroup: oom_kill stayed {after}"
                raise EngineKilled(p.spec.role, signal.Signals(-code).name, log, p.log_path, why)
            # `dsv4bisect serve` exits 125 for infrastructure (port busy); SGLang says so in its log.
            port, bind_failed = p.spec.port, _bind_failure(log)
            local = port is not None and portcheck.is_local_host(self.cfg.host)
            # one look at the port: its holder (None: free), or for a remote host, bindable?
            holder = portcheck.port_holder(self.cfg.host, port) \
                if local and (code == 125 or bind_failed) else None
            busy = holder is not None or (port is not None and not local and bind_failed
                                          and not portcheck.bindable(self.cfg.host, port))
            if code == 125 or (bind_failed and busy):
                if holder is not None:  # taken between our check and the engine's bind
                    raise PortTaken(p.spec.role, holder,
                                    f"the engine exited {code}: it could not bind it", log)
                raise EngineError(f"`{p.spec.role}` could not start (exit {code}): port "
                                  f"{p.spec.port} unavailable?\n{log}",
                                  "another process holds the port; stop it or use port auto")
            raise EngineCrashed(p.spec.role, code, log, p.log_path)

    def stop(self) -> None:
        """SIGTERM every group, grace, SIGKILL; return once each whole group is gone (bounded
        by GRACE_S + groups.GONE_TIMEOUT_S; what is still alive then is named in an event)."""
        self._stopping = True  # from here on, a signalled exit is ours
        known = {p.popen.pid for p in self.procs}
        for popen in [q for q in self._spawned if q.pid not in known]:  # never started: no grace
            _signal_group(popen, signal.SIGKILL)
            wait_gone(popen.pid)
            popen.wait()
        for p in self.procs:
            _signal_group(p.popen, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for p in self.procs:
            if not _exited(p.popen, max(0.1, deadline - time.monotonic())):
                _signal_group(p.popen, signal.SIGKILL)
                _exited(p.popen, GRACE_S)
            # The leader is exited but not yet reaped (a zombie keeps its PID, hence the group
            # id, reserved): the SIGKILL cannot reach a reused group. Children it left behind
            # are killed, and waited for: stop() returns when the whole group is gone.
            _signal_group(p.popen, signal.SIGKILL)
            left = wait_gone(p.popen.pid)
            p.popen.wait()
            if left:
                self._event(p.spec.role, "stopping", f"still alive after SIGKILL: {left}")
            elif self._record is not None:
                self._record.stopped(p.popen.pid)
            try:
                redact_file(p.log_path, secret_values(os.environ, dict(p.spec.env),
                                                      argv=p.spec.argv))
            except OSError:
                pass  # a full disk cannot take the rewritten log: the teardown goes on
            if p.state != "exited":
                p.state = "stopped"
                self._event(p.spec.role, "stopped", "")

    def _last_line(self, proc: Running) -> str:
        """What the live view shows beside the state: not this loop's own readiness polls."""
        return redact_text(last_line(proc.log_path, (proc.spec.ready_path,)),
                           secret_values(os.environ, dict(proc.spec.env), argv=proc.spec.argv))

    def _tail(self, proc: Running, lines: int) -> str:
        return redact_text(tail(proc.log_path, lines),
                           secret_values(os.environ, dict(proc.spec.env), argv=proc.spec.argv))

    def _event(self, role: str, state: str, line: str) -> None:
        if self.on_event is not None:
            self.on_event(role, state, line)


def safe_path(argv: Sequence[str]) -> dict[str, str]:
    """The environment a `python -m dsv4bisect …` process needs so that it runs the installed
    package: `-m` puts the working directory first on sys.path, where a `dsv4bisect/` folder (a
    checkout, a copy) would shadow it, and the engine would run code the fingerprint does not
    describe. PYTHONSAFEPATH (Python 3.11) leaves the directory out; a profile's env can still
    set it otherwise."""
    return {"PYTHONSAFEPATH": "1"} if tuple(argv[1:3]) == ("-m", "dsv4bisect") else {}


def _answers(url: str, timeout: float = 5) -> bool:
    try:
        return requests.get(url, timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


@contextmanager
def _interrupts_after() -> Iterator[None]:
    """SIGINT and SIGTERM held back until the block is done, then delivered to the handlers
    that were in place. A Ctrl-C that lands inside `subprocess.Popen` after the fork (on a
    loaded machine, while the parent waits to hear that the child's exec succeeded) raises
    there, and Popen never returns the child: it runs on in its own session, and no stop()
    knows it. Held back, the interrupt comes once the child is in `_spawned`. Main thread only
    (Python runs signal handlers there; elsewhere nothing is raised inside Popen)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    # a handler not installed from Python (getsignal: None) could not be put back: not held
    previous = {sig: signal.signal(sig, lambda signum, _frame: caught.append(signum))
                for sig in _HELD_SIGNALS if signal.getsignal(sig) is not None}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)


def _exited(popen: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait up to `timeout` for the leader to exit *without reaping it* (waitid WNOWAIT)."""
    if not hasattr(os, "waitid"):  # macOS: reap it (the group id may then be reused: rare)
        try:
            popen.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    deadline = time.monotonic() + timeout
    while True:
        if popen.returncode is not None:
            return True  # already reaped by an earlier poll()
        try:
            if os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                return True
        except ChildProcessError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def _bind_failure(log: str) -> bool:
    text = log.lower()
    return "address already in use" in text or "errno 98" in text or "could not bind" in text


def _signal_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])

