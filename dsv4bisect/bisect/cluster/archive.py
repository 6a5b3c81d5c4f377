"""A directory as one gzipped tar and back: how a trial's files (and the ends a node measured)
travel between a node and the driver (cluster/remote_trial.py, cluster/shared_ends.py)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from dsv4bisect.errors import BisectError


def pack(directory: Path) -> bytes:
    """The directory as one gzipped tar (members relative to it)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for path in sorted(directory.rglob("*")):
            if path.is_file() and not path.is_symlink():
                tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    return buf.getvalue()


def unpack(data: bytes, directory: Path) -> None:
    """Unpack `pack`'s archive into `directory` (plain files only, nothing outside it)."""
    directory.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        for m in members:  # what `pack` writes; anything else is refused, whatever Python
            if not m.isfile() or m.name.startswith("/") or ".." in Path(m.name).parts:
                raise BisectError(f"a node sent a trial archive with `{m.name}` in it",
                                  "the nodes must run the same dsv4bisect as the driver")
        tar.extractall(directory, members=members)
