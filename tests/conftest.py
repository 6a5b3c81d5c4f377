"""Shared test setup: markers, an isolated cache directory, the GPU skip, and Hypothesis.

Property tests draw the same examples on every run (`derandomize`), so CI passes or fails on
the code, not on the draw; `HYPOTHESIS_PROFILE=explore` draws fresh examples to hunt for more.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests assert behaviour, not speed: on a loaded shared machine a generated example can
# take seconds, which must not fail them (no per-example deadline, no "too slow" health check).
_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}

# Triton decides interpreted or compiled when a kernel is jitted, and a test module of any folder
# may jit one at import (the SGLang wheels' kernels, our hooks): on a machine with no NVIDIA
# device every Triton kernel of the session runs in the CPU interpreter, decided here, before
# any folder is collected (tests/kernels' and tests/sglang's conftests came too late for a
# folder collected before them). No torch import: the device nodes tell.
if not Path("/dev/nvidiactl").exists():
    os.environ.setdefault("TRITON_INTERPRET", "1")
settings.register_profile("ci", derandomize=True, **_UNTIMED)
settings.register_profile("explore", derandomize=False, **_UNTIMED)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu = [item for item in items if "gpu" in item.keywords]
    if not gpu or _has_cuda():  # torch is imported only when a gpu test was collected
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in gpu:
        item.add_marker(skip_gpu)


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never read or write the user's ~/.cache/dsv4bisect."""
    monkeypatch.setenv("DSV4BISECT_CACHE", str(tmp_path_factory.mktemp("cache")))


def run_dsv4bisect(*args: str | Path, cwd: Path | None = None, timeout: float = 600,
                   python: Sequence[str] = ("-m", "dsv4bisect"),
                   env: Mapping[str, str | None] | None = None
                   ) -> subprocess.CompletedProcess[str]:
    """`dsv4bisect ARGS` in a subprocess of this interpreter: text output captured, NO_COLOR,
    never raising on a nonzero exit (the tests assert the exit code and the lines).
    `python`: what runs instead of `-m dsv4bisect` (e.g. `-c` code that hides a package);
    `env`: variables set for it on top of this process's (None: unset)."""
    full = {**os.environ, "NO_COLOR": "1", **(env or {})}
    with subprocess.Popen([sys.executable, *python, *map(str, args)], cwd=cwd,
                          env={k: v for k, v in full.items() if v is not None},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:  # its timeout, or the suite's Ctrl-C
            _interrupt(proc)
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


CLI_STOP_GRACE_S = 60.0  # a CLI's engines stopping after its SIGINT (they drain, then exit)


def _interrupt(proc: subprocess.Popen[str]) -> None:
    """Stop a CLI the way a user's Ctrl-C does, then SIGKILL it after `CLI_STOP_GRACE_S`. Its
    engines run in sessions of their own, so a SIGKILL alone (subprocess.run's) would leave
    them up for the rest of the suite, for a `--resume` that never comes."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.communicate(timeout=CLI_STOP_GRACE_S)
    except BaseException:
        proc.kill()
        proc.communicate()


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """The one way the tests invoke the command line as a user would (`run_dsv4bisect`)."""
    return run_dsv4bisect


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mount a real tmpfs of a given size (`mount_tmpfs("8m")`) under tmp_path, unmounted at
    the end: a disk that really fills. Skips where mounting is not allowed (not root)."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        if os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("mounting a tmpfs needs root")
        mnt = tmp_path / f"tmpfs{len(mounted)}"
        mnt.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(mnt)
        return mnt

    try:
        yield mount
    finally:
        for mnt in mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
