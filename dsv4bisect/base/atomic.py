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


def write_text(path: str | os.PathLike[str], text: str, *, private: bool = False) -> Path:
    """`text` to `path` (parents created) through a temporary file beside it, then a rename.
    `private`: readable by its owner only (mode 0600 from the start: it holds secrets)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}."
                         f"{threading.get_ident()}.tmp")
    mode = 0o600 if private else 0o666  # 0666: the umask decides, as open() does
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def write_json(path: str | os.PathLike[str], data: Any, *, indent: int | None = 2,
               sort_keys: bool = False, default: Any = None, private: bool = False) -> Path:
    """`data` as JSON and a newline, atomically (`write_text`)."""
    return write_text(path, json.dumps(data, indent=indent, sort_keys=sort_keys,
                                       default=default) + "\n", private=private)
