"""The launcher with real processes: readiness, patch verification, crashes, timeouts, cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from dsv4bisect.config.resolve import Overrides, resolve
from dsv4bisect.engines.launcher import EngineCrashed, Launch, PortTaken, free_port, safe_path
from dsv4bisect.engines.ports import port_holder
from dsv4bisect.engines.verify import server_info, verify_reference_patches
from dsv4bisect.errors import EngineError, ExitCode, PatchError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it holds no port or GPU.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _command_profile(tmp_path: Path, argv: list[str], ready: str = "/health",
                     timeout: float = 60) -> str:
    path = tmp_path / "cmd.yaml"
    items = "".join(f"\n      - {a!r}" for a in argv)
    path.write_text(f"schema_version: 1\nname: cmd\nengine:\n  kind: command\n"
                    f"  startup_timeout_s: {timeout}\n  command:\n    ready_path: {ready}\n"
                    f"    argv:{items}\n")
    return str(path)


def test_reference_engine_starts_verifies_patches_and_stops(tmp_path: Path) -> None:
    cfg = resolve("reference-all")
    events: list[tuple[str, str]] = []
    with Launch(cfg, tmp_path, on_event=lambda r, s, _: events.append((r, s))) as launch:
        pid = launch.procs[0].popen.pid
        info = server_info(launch.url)
        verify_reference_patches(cfg, info)
        assert requests.get(launch.url + "/health", timeout=5).status_code == 200
        assert launch.verified is True  # the server answering is the one launched
        record = json.loads((tmp_path / "engines.json").read_text())
        (group,) = record["groups"]
        assert group["pid"] == pid and group["state"] == "running"
        assert group["start_time"] == int(Path(f"/proc/{pid}/stat").read_text()
                                          .rsplit(")", 1)[1].split()[19])
        assert record["owner"]["pid"] == os.getpid()
    assert not _alive(pid)
    assert json.loads((tmp_path / "engines.json").read_text())["groups"][0]["state"] == "stopped"
    assert ("server", "ready") in events and events[-1] == ("server", "stopped")
    assert (tmp_path / "logs" / "server.log").read_text()


def test_patch_mismatch_is_an_error(tmp_path: Path) -> None:
    cfg = resolve("reference")
    other = resolve("reference", Overrides(enable=("mhc-bf16",)))
    with Launch(cfg, tmp_path) as launch:
        with pytest.raises(PatchError, match="did not take effect"):
            verify_reference_patches(other, server_info(launch.url))


def _foreign_server(port: int | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """A real server of someone else: `python -m http.server` (answers 200 on `/`)."""
    port = port or free_port("127.0.0.1")
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                             "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while port_holder("127.0.0.1", port) is None:
        assert proc.poll() is None and time.monotonic() < deadline, "http.server did not bind"
        time.sleep(0.05)
    return proc, port


def test_a_fixed_port_held_before_launch_is_cannot_test_with_the_holder_named(
        tmp_path: Path) -> None:
    holder, port = _foreign_server()
    try:
        cfg = resolve("reference", Overrides(sets=(f"engine.port={port}",)))
        launch = Launch(cfg, tmp_path)
        with pytest.raises(PortTaken) as info:
            launch.__enter__()
        assert info.value.exit_code == ExitCode.CANNOT_TEST
        assert f"PID {holder.pid}" in info.value.message and "http.server" in info.value.message
        assert "before launch" in info.value.message
        assert launch.procs == []  # nothing was started
    finally:
        holder.kill()
        holder.wait()


def test_a_foreign_server_answering_on_the_engines_port_is_never_taken_for_it(
        tmp_path: Path) -> None:
    # The engine never binds its port; someone else's server answers there instead.
    argv = [sys.executable, "-c", "import time; time.sleep(120)", "{port}"]
    cfg = resolve(_command_profile(tmp_path, argv, ready="/"))
    launch = Launch(cfg, tmp_path / "run")
    launch.start()
    port = int(launch.url.rsplit(":", 1)[1])
    foreign, _ = _foreign_server(port)
    try:
        with pytest.raises(PortTaken) as info:
            launch.wait_ready()
        assert f"PID {foreign.pid}" in info.value.message and "answered in place" in \
            info.value.message
        assert info.value.exit_code == ExitCode.CANNOT_TEST
    finally:
        launch.stop()
        foreign.kill()
        foreign.wait()
    assert not _alive(launch.procs[0].popen.pid)


def test_engine_that_never_becomes_healthy_times_out_with_the_log_tail(tmp_path: Path) -> None:
    # http.server answers 404 on /health forever: alive, never ready.
    argv = [sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1"]
    cfg = resolve(_command_profile(tmp_path, argv, timeout=3))
    launch = Launch(cfg, tmp_path / "run")
    with pytest.raises(EngineError) as info:
        launch.__enter__()
    assert info.value.exit_code == ExitCode.CANNOT_TEST
    assert "not ready after 3 s" in info.value.message
    assert "GET /health" in info.value.message and "404" in info.value.message
    assert not _alive(launch.procs[0].popen.pid)


def test_crash_at_start_is_a_crash_with_the_log_tail(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('cuda init failed'); sys.exit(3)"]
    cfg = resolve(_command_profile(tmp_path, argv))
    with pytest.raises(EngineCrashed) as info:
        Launch(cfg, tmp_path / "run").__enter__()
    assert info.value.returncode == 3 and "cuda init failed" in info.value.log_tail


def test_an_engine_run_as_python_m_dsv4bisect_runs_the_installed_package_not_a_folder_in_cwd(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `python -m` puts the working directory first on sys.path: a user who launches from a
    # directory holding a `dsv4bisect/` folder would otherwise serve that folder's code
    shadow = tmp_path / "cwd" / "dsv4bisect"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    (shadow / "__main__.py").write_text("import sys; print('the shadow ran'); sys.exit(7)\n")
    monkeypatch.chdir(shadow.parent)
    argv = [sys.executable, "-m", "dsv4bisect", "no-such-command"]
    cfg = resolve(_command_profile(tmp_path, argv))
    with pytest.raises(EngineCrashed) as info:
        Launch(cfg, tmp_path / "run").__enter__()
    assert "the shadow ran" not in info.value.log_tail
    assert info.value.returncode == 2 and "No such command" in info.value.log_tail


def test_only_a_dsv4bisect_process_gets_the_safe_path() -> None:
    assert safe_path(["/usr/bin/python3", "-m", "dsv4bisect", "serve"]) == {"PYTHONSAFEPATH": "1"}
    assert safe_path(["python3", "-m", "sglang.launch_server", "--tp", "8"]) == {}
    assert safe_path(["./server"]) == {}


def test_a_secret_flag_an_engine_prints_never_reaches_its_log_or_the_error(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('started with', sys.argv[-1]); sys.exit(3)",
            "--api-key", "sk-live-0123456789"]
    cfg = resolve(_command_profile(tmp_path, argv))
    launch = Launch(cfg, tmp_path / "run")
    with pytest.raises(EngineCrashed) as info:
        launch.__enter__()
    assert "sk-live-0123456789" not in info.value.log_tail and "started with" in info.value.log_tail
    assert "sk-live-0123456789" not in info.value.log_path.read_text()


def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    # A server that starts a grandchild which ignores SIGTERM; stop() must take both down and
    # return only once both are gone (it failed once on a loaded machine when it did not wait).
    code = ("import subprocess, sys, http.server\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
            "open(sys.argv[2], 'w').write(str(child.pid))\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.end_headers()\n"
            "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")
    pid_file = tmp_path / "child.pid"
    argv = [sys.executable, "-c", code, "{port}", str(pid_file)]
    cfg = resolve(_command_profile(tmp_path, argv))
    with Launch(cfg, tmp_path / "run") as launch:
        leader = launch.procs[0].popen.pid
        child = int(pid_file.read_text())
        assert _alive(child)
    assert not _alive(leader) and not _alive(child)


def test_a_host_that_is_not_this_machine_leaves_the_launch_unverified(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A remote host cannot exist on this box: the one thing injected is the answer to "is this
    # host one of ours?"; the engine, its port and the readiness poll are real.
    import dsv4bisect.engines.ports as ports

    argv = [sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1"]
    cfg = resolve(_command_profile(tmp_path, argv, ready="/"))
    monkeypatch.setattr(ports, "is_local_host", lambda host: False)
    with Launch(cfg, tmp_path / "run") as launch:
        assert launch.verified is False
        assert launch.unverified_why and "not an address of this machine" in \
            launch.unverified_why


def test_a_ctrl_c_inside_the_spawn_stops_the_child_it_had_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a loaded machine a Ctrl-C can land inside `subprocess.Popen` after the fork, while
    the parent waits to hear the child's exec succeeded: raised there, Popen never returns the
    child, and it outlived the interrupted run (tests/run/test_run_signals.py, under load).
    Here the interrupt lands at the end of Popen, the child already running: it is held back
    until the launch knows the child, then stops it."""
    argv = [sys.executable, "-c", "import time; time.sleep(600)"]
    cfg = resolve(_command_profile(tmp_path, argv))
    real = subprocess.Popen
    started: list[int] = []

    def popen_then_ctrl_c(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        child = real(*args, **kwargs)  # type: ignore[call-overload]
        started.append(child.pid)
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs before Popen would return
        return child

    monkeypatch.setattr(subprocess, "Popen", popen_then_ctrl_c)
    launch = Launch(cfg, tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        launch.__enter__()
    assert started and not _alive(started[0])
