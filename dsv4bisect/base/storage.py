"""Storage that fails mid-run — a full disk, a quota, a runs root made read-only or unwritable —
is infrastructure: exit 125 (`git bisect run` skips it) with one `error:` line and a hint, never
a traceback (exit 70). Nothing of the configuration was measured by the write that failed, and
what was written before it stays consistent: the ledger commits each trial in one transaction,
run files are replaced atomically, so `bisect --resume` continues once space or permissions are
back. A `run.json` keeps room for its last word (run/record.py), so a run that the full disk
stopped still says `error`; one that could not is marked abandoned by the next `run`.

The hint says what to do next for the command that failed: `run` is run again (its run
directory says `error`); a bisect names its own `--resume RUN_DIR` (`resume_hint`).
"""

from __future__ import annotations

import errno
import sqlite3

from dsv4bisect.errors import Dsv4BisectError, ExitCode

# OSError numbers that say the storage refused a write, not that an input was wrong.
STORAGE_ERRNOS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
                  errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                  errno.EPERM: "operation not permitted", errno.EIO: "input/output error"}
# SQLite's own words for the same failures (sqlite3.OperationalError carries no errno).
SQLITE_STORAGE = ("database or disk is full", "disk i/o error", "readonly database",
                  "unable to open database file")


class StorageError(Dsv4BisectError):
    """A write failed for lack of space or permission while work was under way (exit 125)."""

    exit_code = ExitCode.CANNOT_TEST


RUN_AGAIN = "free space (or restore write permission on the runs root) and run the command again"


def resume_hint(run_dir: object) -> str:
    return ("free space (or restore write permission on the runs root), then `dsv4bisect "
            f"bisect --resume {run_dir}` continues it, repeating no finished trial")


def storage_failure(exc: BaseException, hint: str = RUN_AGAIN) -> StorageError | None:
    """The storage failure `exc` is (or wraps), as a StorageError with `hint`; None when it is
    another."""
    seen: set[int] = set()
    item: BaseException | None = exc
    while item is not None and id(item) not in seen:
        seen.add(id(item))
        if isinstance(item, OSError) and item.errno in STORAGE_ERRNOS:
            where = f" ({item.filename})" if item.filename else ""
            return StorageError(f"{STORAGE_ERRNOS[item.errno]}{where}: the work stopped "
                                "part-way", hint)
        if isinstance(item, sqlite3.OperationalError) and any(
                words in str(item).lower() for words in SQLITE_STORAGE):
            return StorageError(f"the ledger could not be written: {item}", hint)
        item = item.__cause__ or item.__context__
    return None
