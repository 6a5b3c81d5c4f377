"""The one atomic file write: a reader never sees half a file, a crash never leaves one, and two
writers (threads, processes, nodes on a shared disk) never share a temporary name."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """`text` to `path` (parents created) through a temporary file beside it, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}."
                         f"{threading.get_ident()}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def write_json(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2,
               sort_keys: bool = False, default: Any = None) -> Path:
    """`data` as JSON and a newline, atomically (`write_text`)."""
    return write_text(path, json.dumps(data, indent=indent, sort_keys=sort_keys,
                                       default=default) + "\n")
