"""An engine stopped from outside is no evidence; one that crashes is (issue 30, item 3).

SIGKILL, SIGTERM, SIGINT or SIGHUP that dsv4bisect did not send (an operator, another job) ends
the trial CANNOT_TEST (`EngineKilled`, exit 125) — unless the memory cgroup's `oom_kill` count
rose, which makes it the configuration's own out-of-memory: a crash. SIGSEGV, SIGBUS, SIGABRT,
SIGFPE, SIGILL and non-zero exits stay crashes (`EngineCrashed`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4bisect.config.resolve import resolve
from dsv4bisect.engines.launcher import EngineCrashed, EngineKilled, Launch
from dsv4bisect.errors import ExitCode

SERVER = ("import http.server, sys\n"
          "class H(http.server.BaseHTTPRequestHandler):\n"
          "    def do_GET(self):\n"
          "        self.send_response(200); self.end_headers()\n"
          "    def log_message(self, *a): pass\n"
          "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


def _profile(tmp_path: Path, argv: list[str]) -> str:
    path = tmp_path / "cmd.yaml"
    items = "".join(f"\n      - {json.dumps(a)}" for a in argv)  # JSON is YAML
    path.write_text(f"schema_version: 1\nname: cmd\nengine:\n  kind: command\n"
                    f"  startup_timeout_s: 120\n  command:\n    ready_path: /health\n"
                    f"    argv:{items}\n")
    return path.as_posix()


def _exit_of(launch: Launch) -> BaseException:
    launch.procs[0].popen.wait(timeout=60)
    with pytest.raises((EngineKilled, EngineCrashed)) as info:
        launch.check_alive()
    return info.value


def test_sigkill_of_a_real_embedded_engine_is_cannot_test(tmp_path: Path) -> None:
    with Launch(resolve("reference"), tmp_path) as launch:
        os.kill(launch.procs[0].popen.pid, signal.SIGKILL)
        exc = _exit_of(launch)
    assert isinstance(exc, EngineKilled) and exc.exit_code == ExitCode.CANNOT_TEST
    assert "killed by SIGKILL, which dsv4bisect did not send" in exc.message
    assert "oom_kill stayed" in exc.message or "no memory cgroup" in exc.message


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_other_stop_signals_from_outside_are_cannot_test(tmp_path: Path, sig: int) -> None:
    # A bare server with default handlers: the signal ends it (SIGINT: KeyboardInterrupt, exit 1
    # with a traceback — Python's own handler; restored to the default so the kernel ends it).
    code = f"import signal; signal.signal({int(sig)}, signal.SIG_DFL)\n" + SERVER
    with Launch(resolve(_profile(tmp_path, [sys.executable, "-c", code, "{port}"])),
                tmp_path / "run") as launch:
        os.kill(launch.procs[0].popen.pid, sig)
        exc = _exit_of(launch)
    assert isinstance(exc, EngineKilled), exc
    assert signal.Signals(sig).name in str(exc)


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE,
                                 signal.SIGILL])
def test_faults_of_the_process_itself_stay_crashes(tmp_path: Path, sig: int) -> None:
    with Launch(resolve(_profile(tmp_path, [sys.executable, "-c", SERVER, "{port}"])),
                tmp_path / "run") as launch:
        os.kill(launch.procs[0].popen.pid, sig)
        exc = _exit_of(launch)
    assert isinstance(exc, EngineCrashed) and exc.returncode == -sig


def test_a_non_zero_exit_stays_a_crash(tmp_path: Path) -> None:
    code = "import sys, time; time.sleep(0.5); sys.exit(3)\n"
    launch = Launch(resolve(_profile(tmp_path, [sys.executable, "-c", code])), tmp_path / "run")
    with pytest.raises(EngineCrashed) as info:
        launch.__enter__()
    assert info.value.returncode == 3


def test_our_own_stop_is_not_reported(tmp_path: Path) -> None:
    with Launch(resolve(_profile(tmp_path, [sys.executable, "-c", SERVER, "{port}"])),
                tmp_path / "run") as launch:
        pass
    assert launch.procs[0].popen.returncode is not None
    launch.check_alive()  # exited by our SIGTERM: nothing to report


OOM_DRIVER = """
import os, sys, time
from pathlib import Path
cg = Path(sys.argv[1])
(cg / "cgroup.procs").write_text(str(os.getpid()))  # the driver and its engines live here
from dsv4bisect.config.resolve import resolve
from dsv4bisect.engines.launcher import EngineCrashed, EngineKilled, Launch
launch = Launch(resolve(sys.argv[2]), Path(sys.argv[3]))
launch.__enter__()
try:
    launch.procs[0].popen.wait(timeout=120)
    try:
        launch.check_alive()
        print("RESULT none")
    except EngineCrashed as exc:
        print("RESULT crashed", exc.returncode, "out-of-memory killer" in exc.log_tail)
    except EngineKilled as exc:
        print("RESULT killed", exc.message.splitlines()[0])
finally:
    launch.stop()
"""


def _memory_cgroup(tmp_path: Path) -> Path | None:
    for root in (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")):
        if (root / "cgroup.procs").is_file() and os.access(root, os.W_OK):
            cg = root / f"dsv4bisect-oom-test-{os.getpid()}"
            try:
                cg.mkdir()
                limit = "memory.limit_in_bytes" if root.name == "memory" else "memory.max"
                (cg / limit).write_text(str(400 << 20))
                swap = cg / "memory.memsw.limit_in_bytes"
                if swap.exists():
                    swap.write_text(str(400 << 20))
                return cg
            except OSError:
                return None
    return None


def test_the_oom_killer_is_the_configurations_own_crash(tmp_path: Path) -> None:
    cg = _memory_cgroup(tmp_path)
    if cg is None:
        pytest.skip("cannot create a memory cgroup here (needs root and cgroupfs)")
    # Ready, then asks for ~2 GiB in a 400 MiB cgroup: the kernel's OOM killer sends SIGKILL.
    hog = SERVER.replace("http.server.HTTPServer(", "import threading\n"
                         "def hog():\n    import time; time.sleep(1); b = [bytearray(1 << 20)"
                         " for _ in range(2048)]\nthreading.Thread(target=hog).start()\n"
                         "http.server.HTTPServer(")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", OOM_DRIVER, str(cg),
             _profile(tmp_path, [sys.executable, "-c", hog, "{port}"]), str(tmp_path / "run")],
            capture_output=True, text=True, timeout=300, env={**os.environ}, check=False)
        result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
        assert result == ["RESULT crashed -9 True"], (proc.stdout, proc.stderr[-2000:])
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)
