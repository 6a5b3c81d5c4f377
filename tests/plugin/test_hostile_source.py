"""`switches --sglang-src` and `doctor --sglang-src` on hostile wheels and trees (issue 40,
item 5): each is exit 5 with `error:` and `hint:`, within a 1 GiB address-space limit and
seconds, never a traceback (exit 70 before: UnicodeDecodeError, RecursionError, MemoryError).

Real CLI processes under `resource.setrlimit(RLIMIT_AS, 1 GiB)`. The hostile file is both
`sglang/srt/environ.py` (what `switches` reads first) and `sglang/version.py` (what `doctor`
reads first). The bomb here declares 64 MiB, past the 8 MiB a source file may be; the 2 GiB
one of the field report is in tests/benchmarks/hostile_inputs.py (its archive takes a minute
to write), refused by the same check.
"""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from dsv4bisect.base.bounded import LIMITS

pytestmark = pytest.mark.timeout(300)

GIB = 1 << 30
HOSTILE_FILES = ("sglang/srt/environ.py", "sglang/version.py")
PER_FILE = LIMITS["source"].max_bytes


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (GIB, GIB))


def run(command: str, src: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsv4bisect", command, "--sglang-src", str(src)],
                          capture_output=True, text=True, timeout=120, preexec_fn=limited,
                          env={**os.environ, "COLUMNS": "200"})


def wheel(path: Path, body: bytes | Callable[[zipfile.ZipFile, str], None]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr("sglang/__init__.py", "")
        for name in HOSTILE_FILES:
            if callable(body):
                body(z, name)
            else:
                z.writestr(name, body)
    return path


def tree(path: Path, body: bytes) -> Path:
    for name in ("sglang/__init__.py", *HOSTILE_FILES):
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(b"" if name.endswith("__init__.py") else body)
    return path


def bomb(size: int) -> Callable[[zipfile.ZipFile, str], None]:
    def write(z: zipfile.ZipFile, name: str) -> None:
        with z.open(name, "w", force_zip64=True) as f:
            chunk = b"#" * (4 << 20)
            for _ in range(size // len(chunk)):
                f.write(chunk)
    return write


def lying(path: Path) -> Path:
    """A member of PER_FILE + 1 MiB whose headers declare 1 KiB: only the read can tell."""
    wheel(path, b"#" * (PER_FILE + (1 << 20)))
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if info.filename in HOSTILE_FILES:
                struct.pack_into("<I", data, info.header_offset + 22, 1024)  # local header
    central = data.find(b"PK\x01\x02")
    while central >= 0:  # every central-directory entry's uncompressed size
        name_len = struct.unpack_from("<H", data, central + 28)[0]
        if bytes(data[central + 46: central + 46 + name_len]).decode() in HOSTILE_FILES:
            struct.pack_into("<I", data, central + 24, 1024)
        central = data.find(b"PK\x01\x02", central + 4)
    path.write_bytes(bytes(data))
    return path


DEEP = b"x = " + b"+".join([b"1"] * 200_000) + b"\n"


@pytest.mark.parametrize("make", [
    pytest.param(lambda d: wheel(d / "utf8.whl", b"X = 'caf\xe9'\n"), id="wheel-invalid-utf8"),
    pytest.param(lambda d: tree(d, b"X = 'caf\xe9'\n"), id="tree-invalid-utf8"),
    pytest.param(lambda d: wheel(d / "deep.whl", DEEP), id="wheel-200000-terms"),
    pytest.param(lambda d: tree(d, b"x = " + b"-" * 900 + b"1\n"), id="tree-900-deep"),
    pytest.param(lambda d: wheel(d / "bomb.whl", bomb(64 << 20)), id="wheel-bomb"),
    pytest.param(lambda d: lying(d / "lying.whl"), id="wheel-lying-sizes"),
])
@pytest.mark.parametrize("command", ["switches", "doctor"])
def test_a_hostile_source_is_exit_5_with_a_hint(tmp_path: Path, make, command: str) -> None:
    src = make(tmp_path)
    proc = run(command, src)
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "error:" in proc.stderr and "hint:" in proc.stderr


@pytest.mark.parametrize("command", ["switches", "doctor"])
def test_a_3_gib_source_file_is_refused_by_size(tmp_path: Path, command: str) -> None:
    root = tree(tmp_path, b"")
    for name in HOSTILE_FILES:
        with (root / name).open("wb") as f:
            f.truncate(3 * GIB)  # sparse: no disk used
    proc = run(command, root)
    assert proc.returncode == 5, proc.stderr[-2000:]
    assert "larger than the 8 MiB a Python source file may be" in proc.stderr
