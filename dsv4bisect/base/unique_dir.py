"""Output directories no two commands share: `<parent>/<prefix>-<UTC time>-<random>`.

Two `probe`s (or `microtest`s) started in the same second with the default output used to
write into one directory, the later overwriting the other's results. The name carries the UTC
time (sortable, the same on every host) and 6 random hex digits, and the directory is created
with an exclusive `mkdir`: a collision, however unlikely, picks another name instead of sharing.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from pathlib import Path

from dsv4bisect.errors import Dsv4BisectError


def make_unique_dir(parent: Path, prefix: str) -> Path:
    """Create and return a new directory under `parent` (created too) that nobody else has."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for _ in range(16):
        path = parent / f"{prefix}-{stamp}-{secrets.token_hex(3)}"
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            raise Dsv4BisectError(f"cannot create the output directory {path}: {exc.strerror}",
                                  "free space, or pass --out a writable directory") from None
    raise Dsv4BisectError(f"no unused output directory name under {parent}",
                          "pass --out a directory of your own")
