"""One configuration's engine across launch attempts: start, verify patches, probe, stop.

Crash semantics (DESIGN §6): an engine process that exits — before it is ready, or while it is
probed — is a crash; the arm records it, stops what is left, and relaunches once. A second crash
raises `ArmCrashed` (the session turns it into FAIL `crash` for the candidate, CANNOT_TEST for
the good end). Infrastructure errors (`EngineError`: busy port, health timeout; a `ProbeError`
while every process is alive) are not retried: they propagate, and the run cannot test.

Every arm of a run is registered with a `Supervisor`; on Ctrl-C/SIGTERM the main thread calls
`Supervisor.stop_all()`, which stops every engine (spawning holds the same lock, so no process can
be started after that and escape), and any arm still working raises `Cancelled`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from dsv4bisect.config.engine_config import EngineConfig
from dsv4bisect.engines.launcher import EXIT_WAIT_S, EngineCrashed, Launch, PortTaken
from dsv4bisect.engines.receipts import check_receipts
from dsv4bisect.engines.verify import server_info, verify_reference_patches
from dsv4bisect.errors import EngineError, ProbeError
from dsv4bisect.run.crash import TAIL_LINES, Crash
from dsv4bisect.run.events import EngineEvent, EventSink, Notice
from dsv4bisect.run.signals import check_interrupt

T = TypeVar("T")
MAX_CRASHES = 2  # a crash is retried once; the second one is the arm's outcome


class Cancelled(Exception):
    """The run was interrupted; its engines are being stopped."""


class ArmCrashed(Exception):
    """The engine of one configuration crashed on every attempt."""

    def __init__(self, crashes: list[Crash]) -> None:
        super().__init__(crashes[-1].sentence())
        self.crashes = crashes


class Supervisor:
    """Every engine of a run, so that an interrupt can stop them all from the main thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.cancelled = False
        self._launches: list[Launch] = []
        self._stopped: set[int] = set()  # id() of launches already stopped
        self._gates: dict[int, threading.Lock] = {}  # one stop at a time per launch

    def spawn(self, launch: Launch) -> None:
        with self.lock:
            if self.cancelled:
                raise Cancelled()
            self._launches.append(launch)
            try:
                launch.start()
            except BaseException:
                self._stopped.add(id(launch))
                launch.stop()
                raise

    def stop(self, launch: Launch) -> None:
        """Stop one launch, once (a second killpg could reach a reused process-group id); a
        caller that finds another thread stopping it waits until that stop is complete."""
        with self.lock:
            gate = self._gates.setdefault(id(launch), threading.Lock())
        with gate:
            if id(launch) not in self._stopped:
                launch.stop()
                self._stopped.add(id(launch))

    def stop_all(self) -> None:
        with self.lock:
            self.cancelled = True
            launches = list(self._launches)
        for launch in launches:
            self.stop(launch)


class EngineArm:
    """Launch attempts of one configuration into `arm_dir` (logs/, receipts/ inside)."""

    def __init__(self, name: str, cfg: EngineConfig, arm_dir: Path, supervisor: Supervisor,
                 on_event: EventSink) -> None:
        self.name, self.cfg, self.dir = name, cfg, arm_dir
        self.supervisor, self.on_event = supervisor, on_event
        self.launch: Launch | None = None
        self.attempts = 0  # launches (a crash or a lost port relaunches)
        self.port_retries = 0
        self.crashes: list[Crash] = []
        self.launch_s: list[float] = []  # spawn -> ready (verified), per successful attempt
        # Whether every launch that got ready was proven to be the server answering (False:
        # a host that is not this machine; launcher.Launch.verified). None before the first.
        self.verified: bool | None = None
        self._ready = False
        self._waiter: threading.Thread | None = None  # the thread inside wait_ready()
        self._t_spawn = 0.0

    # -- lifecycle -------------------------------------------------------------------------
    def spawn(self) -> None:
        """Start the processes (returns at once; `ready()` waits)."""
        self.attempts += 1
        attempt = self.attempts

        def event(role: str, state: str, line: str) -> None:
            self.on_event(EngineEvent(self.name, attempt, role, state, line))
            # A readiness poll in the thread that waits (never a stop() from another thread):
            # a safe point to act on a Ctrl-C whose first KeyboardInterrupt was lost.
            if self._waiter is threading.current_thread():
                check_interrupt()

        self.launch = Launch(self.cfg, self.dir, on_event=event)
        self._ready = False
        self._t_spawn = time.perf_counter()
        try:
            self.supervisor.spawn(self.launch)
        except OSError as exc:  # e.g. a `command` engine whose program does not exist
            raise EngineError(f"cannot start the {self.name} engine: {exc}",
                              "check engine.command.argv (or engine.python)") from exc

    def ready(self) -> str:
        """The entry URL once every process is ready and the patches are verified."""
        while True:
            if self.launch is None:
                self.spawn()
            assert self.launch is not None
            if self._ready:
                return self.launch.url
            self._waiter = threading.current_thread()
            try:
                self.launch.wait_ready()
            except EngineCrashed as exc:
                self._crashed("start", exc)
                continue
            except EngineError as exc:
                if not self._lost_auto_port(exc):
                    raise
                self._relaunch_on_new_port()
                continue
            finally:
                self._waiter = None
            self._owner_checked(self.launch)
            verify_patches(self.cfg, self.launch)
            self._ready = True
            self.launch_s.append(round(time.perf_counter() - self._t_spawn, 3))
            return self.launch.url

    def _owner_checked(self, launch: Launch) -> None:
        ok = launch.verified is True
        if not ok and self.verified is not False:
            self.on_event(Notice(f"{self.name}: {launch.unverified_why}; its results are not "
                                 "cached", "warn"))
        self.verified = ok if self.verified is None else (self.verified and ok)

    def probe(self, work: Callable[[str], T]) -> T:
        """Run `work(url)`; a crash during it relaunches the engine and runs `work` again."""
        while True:
            url = self.ready()
            try:
                return work(url)
            except ProbeError:
                if self.supervisor.cancelled:
                    raise Cancelled() from None
                exc = self._exited()
                if exc is None:
                    raise  # the engine is alive: infrastructure, not a crash
                self._crashed("probe", exc)

    def stop(self) -> None:
        if self.launch is not None:
            self.supervisor.stop(self.launch)

    def log_tail(self, lines: int = TAIL_LINES) -> tuple[str, str | None]:
        """(tail, path) of the entry process's log, for CANNOT_TEST reasons."""
        from dsv4bisect.engines.logs import tail

        path = self.dir / "logs" / f"{self.cfg.entry_role}.log"
        return (tail(path, lines), str(path)) if path.exists() else ("", None)

    # -- crashes and lost ports --------------------------------------------------------------
    def _lost_auto_port(self, exc: EngineError) -> bool:
        """A port chosen free at launch was taken by another process before the engine bound
        it (the engine exited 125, or another server answered on it): our race, not the user's
        environment; retried once. A port the profile fixed is never retried."""
        assert self.launch is not None
        auto = {p.role for p in self.cfg.processes if p.port is None}
        if self.port_retries >= 1:
            return False
        if isinstance(exc, PortTaken):
            return exc.role in auto
        return any(p.popen.returncode == 125 and p.spec.role in auto for p in self.launch.procs)

    def _relaunch_on_new_port(self) -> None:
        self.port_retries += 1
        self.stop()
        self._mark_logs("--- dsv4bisect: the port chosen for the engine was taken before it "
                        "could bind it; relaunching on another free port ---")
        self.on_event(Notice(f"{self.name}: its free port was taken by another process; "
                             "relaunching on another", "warn"))
        self.launch = None


    def _exited(self) -> EngineCrashed | None:
        """The crash, if a process of this arm exited (waiting briefly for a dying one)."""
        assert self.launch is not None
        exc = self.launch.exited(EXIT_WAIT_S)
        if exc is None or isinstance(exc, EngineCrashed):
            return exc
        raise exc  # ended, but not a crash (killed from outside, a port taken)

    def _crashed(self, phase: str, exc: EngineCrashed) -> None:
        if self.supervisor.cancelled:
            raise Cancelled() from exc
        self.crashes.append(Crash(self.name, self.attempts, phase, exc.role, exc.returncode,
                                  exc.log_tail, str(exc.log_path)))
        self.stop()
        if len(self.crashes) >= MAX_CRASHES:
            raise ArmCrashed(self.crashes) from exc
        self._mark_logs(f"--- dsv4bisect: the engine crashed ({self.crashes[-1].sentence()}); "
                        "relaunching once ---")
        receipts = self.dir / "receipts"
        if receipts.is_dir():  # stale receipts must not vouch for the next attempt
            os.replace(receipts, self.dir / f"receipts-attempt{self.attempts}")
        self.launch = None

    def _mark_logs(self, line: str) -> None:
        for log in sorted((self.dir / "logs").glob("*.log")):
            with open(log, "a") as f:
                f.write(f"\n{line}\n")


def verify_patches(cfg: EngineConfig, launch: Launch) -> None:
    """Every requested patch took effect, or the trial is an error (never a silent pass)."""
    if cfg.kind == "reference":
        verify_reference_patches(cfg, server_info(launch.url))
    elif cfg.kind in ("sglang", "vllm"):  # the plugin's receipts, per scheduler / worker
        _check_sglang_receipts(cfg, launch)
    # kind `command`: an opaque server; what it does with DSV4BISECT_PATCHES is its own business.


def _check_sglang_receipts(cfg: EngineConfig, launch: Launch) -> None:
    # The plugin writes one receipt per installed hook per scheduler process; a requested patch
    # without a receipt in every scheduler is a PatchError (never a silent pass).
    check_receipts(cfg, launch.receipts_dir, [p.spec for p in launch.procs])
