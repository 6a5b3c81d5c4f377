"""The trial ledger: SQLite in WAL mode, every write committed before the next step.

Trials are keyed by (configuration fingerprint, probe spec hash, seed block). A trial with a
definitive verdict (PASS, FAIL, WARN) is never run again for the same key, by any bisect; a
deliberate re-test of a configuration draws the next seed block. Attempts that could not test
(CANNOT_TEST, crashes) belong to the bisect run that made them. A trial is written as
`running` before it starts, so a bisect killed at any point (kill -9, power loss: synchronous
FULL) finds it on resume and runs it again. Noise evidence (A/A runs, end checks, re-tests)
accumulates across bisects.

One writer per ledger: `Ledger.open` takes an exclusive `flock` on `<ledger>.lock` beside it for
as long as it is open (the kernel drops it when the process dies, even by `kill -9`, so a stale
lock cannot exist); a second writer gets a BisectError naming the holder's PID. Holding the lock
proves that no other driver is alive, so every trial row still `running` was left by a dead one
and is marked `abandoned` on the spot. Readers (`report`) use `Ledger.open_readonly`, which
takes no lock and creates no file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sqlite3
import stat
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dsv4bisect.bisect.ledger_rows import (
    DAMAGED_HINT,
    SCHEMA,
    SCHEMA_VERSION,
    DamagedRow,
    NoiseEstimate,
    RunRow,
    StepRow,
    TrialKey,
    TrialRow,
    run_from_row,
    step_from_row,
    trial_from_row,
)
from dsv4bisect.errors import BisectError

if TYPE_CHECKING:
    from typing_extensions import Self


LOCK_SUFFIX = ".lock"
T = TypeVar("T")


class Ledger:
    """One SQLite file; open it with `Ledger.open(path)` (the one writer) or
    `Ledger.open_readonly(path)`. Use from one thread."""

    def __init__(self, conn: sqlite3.Connection, path: Path, lock_fd: int | None = None) -> None:
        self._conn = conn
        self.path = path
        self._lock_fd = lock_fd
        self.reconciled = 0  # `running` trial rows of dead drivers marked abandoned at open

    @classmethod
    def open(cls, path: str | Path) -> Ledger:
        """The writer: exclusive for as long as it is open (see the module doc)."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BisectError(f"cannot create the ledger's directory `{path.parent}`: "
                              f"{exc.strerror}", "point --ledger (or --out) at a writable "
                              "directory") from None
        lock_fd = _lock(path)
        try:
            _own_file(path)
            conn = _connect(path)
        except BaseException:
            os.close(lock_fd)
            raise
        ledger = cls(conn, path, lock_fd)
        with ledger._tx() as c:
            ledger.reconciled = c.execute(
                "UPDATE trials SET status = 'abandoned' WHERE status = 'running'").rowcount
        return ledger

    @classmethod
    def open_readonly(cls, path: str | Path) -> Ledger:
        """A reader: no lock, no file created (a missing ledger is an error, not a new one).

        SQLite's `mode=ro` still creates the WAL's `-shm`/`-wal` side files when they are
        missing; they are missing exactly when no writer has the ledger open and everything is
        in the main file, so that case opens `immutable` instead, which touches nothing."""
        path = Path(path)
        if not path.is_file():
            raise BisectError(f"the ledger `{path}` does not exist",
                              "was it moved or deleted? the bisect's bisect.json names it; "
                              "reading a bisect creates nothing")
        live = Path(f"{path}-wal").exists()
        uri = path.resolve().as_uri() + ("?mode=ro" if live else "?mode=ro&immutable=1")
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=30.0, isolation_level=None)
            conn.row_factory = sqlite3.Row
            found = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            tables = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            raise BisectError(f"cannot read the ledger `{path}`: {exc}",
                              "is it a dsv4bisect ledger? bisect.json names it") from None
        _check_schema(path, found)
        missing = sorted({"runs", "trials", "steps", "noise_evidence"} - tables)
        if missing:  # a writer re-creates them; a reader cannot
            conn.close()
            raise BisectError(f"the ledger `{path}` has no table {', '.join(missing)}",
                              DAMAGED_HINT)
        return cls(conn, path)

    def close(self) -> None:
        self._conn.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def journal_mode(self) -> str:
        return str(self._conn.execute("PRAGMA journal_mode").fetchone()[0])

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    # -- runs ----------------------------------------------------------------------------------
    def create_run(self, run_dir: str | Path, settings: Mapping[str, Any]) -> str:
        run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        with self._tx() as c:
            c.execute(
                "INSERT INTO runs VALUES (?, ?, ?, ?, 'running', NULL)",
                (run_id, str(run_dir), time.time(), json.dumps(dict(settings))),
            )
        return run_id

    def get_run(self, run_id: str) -> RunRow:
        row = self._conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise BisectError(
                f"no bisect run `{run_id}` in ledger `{self.path}`",
                "check --resume points at the run directory of that bisect",
            )
        return self._rows(run_from_row, [row])[0]

    def finish_run(self, run_id: str, status: str, result: Mapping[str, Any]) -> None:
        with self._tx() as c:
            c.execute(
                "UPDATE runs SET status = ?, result = ? WHERE id = ?",
                (status, json.dumps(dict(result)), run_id),
            )

    # -- trials --------------------------------------------------------------------------------
    def start_trial(
        self,
        run_id: str,
        step: int,
        key: TrialKey,
        attempt: int,
        patches: Mapping[str, str],
        subset: frozenset[str],
        trial_dir: str,
    ) -> int:
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO trials (run_id, step, fingerprint, probe, seed_block, attempt, "
                "patches, subset, status, trial_dir, started) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?)",
                (
                    run_id,
                    step,
                    key.fingerprint,
                    key.probe,
                    key.seed_block,
                    attempt,
                    json.dumps(dict(patches)),
                    json.dumps(sorted(subset)),
                    trial_dir,
                    time.time(),
                ),
            )
            return int(cur.lastrowid or 0)

    def finish_trial(
        self,
        trial_id: int,
        verdict: str,
        signature: str | None,
        details: Mapping[str, Any],
        duration_s: float,
        throughput: float | None,
        log_path: str | None,
    ) -> None:
        with self._tx() as c:
            c.execute(
                "UPDATE trials SET status = 'done', verdict = ?, signature = ?, details = ?, "
                "duration_s = ?, throughput = ?, log_path = ?, finished = ? WHERE id = ?",
                (
                    verdict,
                    signature,
                    json.dumps(dict(details), default=str),
                    duration_s,
                    throughput,
                    log_path,
                    time.time(),
                    trial_id,
                ),
            )

    def abort_trial(self, trial_id: int) -> None:
        """The trial was interrupted (not finished): a resume runs it again."""
        with self._tx() as c:
            c.execute(
                "UPDATE trials SET status = 'aborted', finished = ? WHERE id = ?",
                (time.time(), trial_id),
            )

    def abandon_running(self, run_id: str) -> int:
        """On resume: trials left `running` by a killed bisect are marked abandoned."""
        with self._tx() as c:
            cur = c.execute(
                "UPDATE trials SET status = 'abandoned' WHERE run_id = ? AND status = 'running'",
                (run_id,),
            )
            return cur.rowcount

    def clear_steps(self, run_id: str) -> None:
        """On resume: the search's records are written again as the driver replays them (a
        re-tried CANNOT_TEST may lead the search elsewhere: no record of the old path stays)."""
        with self._tx() as c:
            c.execute("DELETE FROM steps WHERE run_id = ?", (run_id,))

    def definitive(self, key: TrialKey) -> TrialRow | None:
        """The finished PASS/FAIL/WARN/BETWEEN trial for this key, from any bisect."""
        row = self._conn.execute(
            "SELECT * FROM trials WHERE fingerprint = ? AND probe = ? AND seed_block = ? AND "
            "status = 'done' AND verdict IN ('PASS', 'FAIL', 'WARN', 'BETWEEN')",
            (key.fingerprint, key.probe, key.seed_block),
        ).fetchone()
        return self._rows(trial_from_row, [row])[0] if row else None

    def attempts(self, run_id: str, key: TrialKey) -> list[TrialRow]:
        """This run's finished attempts for the key that did not test (CANNOT_TEST, crash)."""
        rows = self._conn.execute(
            "SELECT * FROM trials WHERE run_id = ? AND fingerprint = ? AND probe = ? AND "
            "seed_block = ? AND status = 'done' AND verdict = 'CANNOT_TEST' ORDER BY id",
            (run_id, key.fingerprint, key.probe, key.seed_block),
        ).fetchall()
        return self._rows(trial_from_row, rows)

    def trials(self, run_id: str) -> list[TrialRow]:
        """Every trial row this run wrote (reused trials of other runs are in `steps`)."""
        rows = self._conn.execute(
            "SELECT * FROM trials WHERE run_id = ? ORDER BY id", (run_id,)
        ).fetchall()
        return self._rows(trial_from_row, rows)

    def trial(self, trial_id: int) -> TrialRow:
        row = self._conn.execute("SELECT * FROM trials WHERE id = ?", (trial_id,)).fetchone()
        if row is None:
            raise BisectError(f"no trial {trial_id} in ledger `{self.path}`",
                              "the ledger was edited or replaced; point --ledger at the one "
                              "this bisect wrote")
        return self._rows(trial_from_row, [row])[0]

    def _rows(self, parse: Callable[[sqlite3.Row], T], rows: Sequence[sqlite3.Row]) -> list[T]:
        """Rows parsed and checked; a damaged one is a BisectError naming it (exit 5)."""
        try:
            return [parse(r) for r in rows]
        except DamagedRow as exc:
            raise BisectError(f"`{self.path}`: {exc}", DAMAGED_HINT) from None

    # -- the search's records ------------------------------------------------------------------
    def put_step(self, run_id: str, step: StepRow) -> None:
        with self._tx() as c:
            c.execute(
                "INSERT OR REPLACE INTO steps VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    step.step,
                    json.dumps(sorted(step.subset)),
                    step.seed_block,
                    step.outcome,
                    step.signature,
                    step.trial_id,
                ),
            )

    def steps(self, run_id: str) -> list[StepRow]:
        rows = self._conn.execute(
            "SELECT * FROM steps WHERE run_id = ? ORDER BY step", (run_id,)
        ).fetchall()
        return self._rows(step_from_row, rows)

    # -- noise ---------------------------------------------------------------------------------
    def add_noise_evidence(
        self,
        probe: str,
        source: str,
        truth: str,
        outcome: str,
        *,
        fingerprint: str | None = None,
        run_id: str | None = None,
        trial_id: int | None = None,
    ) -> None:
        """One probe run on a configuration whose truth ('pass'/'fail') is known: an A/A
        comparison ('aa'), an end check of a bisect whose ends differ ('end'), or a re-test
        ('retest')."""
        if truth not in ("pass", "fail") or outcome not in ("pass", "fail"):
            raise BisectError(f"noise evidence needs pass/fail, got {truth!r}/{outcome!r}",
                              "record noise evidence as pass or fail")
        with self._tx() as c:
            c.execute(
                "INSERT INTO noise_evidence (probe, source, truth, outcome, fingerprint, "
                "run_id, trial_id, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (probe, source, truth, outcome, fingerprint, run_id, trial_id, time.time()),
            )

    def has_noise_evidence(self, run_id: str, sources: Sequence[str] = ("end", "retest")) -> bool:
        marks = ",".join("?" * len(sources))
        row = self._conn.execute(
            f"SELECT 1 FROM noise_evidence WHERE run_id = ? AND source IN ({marks}) LIMIT 1",
            (run_id, *sources),
        ).fetchone()
        return row is not None

    def trial_durations(self, probe: str) -> list[float]:
        """Wall times of the finished trials measured with `probe` (what `--plan` costs a trial)."""
        rows = self._conn.execute(
            "SELECT duration_s FROM trials WHERE probe = ? AND status = 'done' "
            "AND duration_s IS NOT NULL ORDER BY id", (probe,)).fetchall()
        return [float(r["duration_s"]) for r in rows]

    def trial_details(self, probe: str) -> list[dict[str, Any]]:
        """The details of the finished trials measured with `probe` (the runner's measured
        launch, switch and probe seconds, where it reports them: what `--plan` prices)."""
        rows = self._conn.execute(
            "SELECT details FROM trials WHERE probe = ? AND status = 'done' "
            "AND details IS NOT NULL ORDER BY id", (probe,)).fetchall()
        out = []
        for row in rows:
            try:
                value = json.loads(row["details"])
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
        return out

    def measured_noise(self, probe: str, sources: Sequence[str] | None = None) -> NoiseEstimate:
        query = (
            "SELECT truth, outcome, COUNT(*) AS n FROM noise_evidence WHERE probe = ?"
            + (f" AND source IN ({','.join('?' * len(sources))})" if sources else "")
            + " GROUP BY truth, outcome"
        )
        counts = {
            (r["truth"], r["outcome"]): r["n"]
            for r in self._conn.execute(query, (probe, *(sources or ())))
        }
        good = counts.get(("pass", "pass"), 0) + counts.get(("pass", "fail"), 0)
        bad = counts.get(("fail", "fail"), 0) + counts.get(("fail", "pass"), 0)
        return NoiseEstimate(
            good, counts.get(("pass", "fail"), 0), bad, counts.get(("fail", "pass"), 0)
        )


def _own_file(path: Path) -> None:
    """The ledger and SQLite's side files are plain files here: a symlink (a dangling one
    planted at `<runs root>/ledger.sqlite` made SQLite create a database at its target) is
    refused. A new ledger is created readable by its owner only: its trials record the
    test command as given, secrets included (SQLite gives its side files the same mode)."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        side = Path(f"{path}{suffix}")
        if side.is_symlink():
            raise BisectError(f"the ledger file `{side}` is a symbolic link: refusing to open "
                              "or create a database through it",
                              "remove it if it is not yours, or give --ledger the real path "
                              "(or --out a directory of your own)")
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600))
    except FileExistsError:  # an older ledger of ours, readable by others: ours alone now
        with suppress(OSError):  # a read-only runs root: a reader's ledger
            st = path.stat()
            if st.st_uid == os.getuid() and st.st_mode & 0o077:
                os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
    except OSError as exc:
        raise BisectError(f"cannot create the ledger `{path}`: {exc.strerror}",
                          "point --ledger (or --out) at a writable directory") from None


def _lock(path: Path) -> int:
    """An exclusive flock on `<ledger>.lock`, its holder's PID written in it; or BisectError."""
    lock_path = Path(f"{path}{LOCK_SUFFIX}")
    # O_NOFOLLOW, and a regular file with one link: on a shared runs root a planted symlink
    # (or hard link) would otherwise make us truncate its target and write a PID into it.
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(lock_path, flags, 0o644)  # O_CLOEXEC: not inherited by engines
    except OSError as exc:
        why = "it is a symbolic link, which a lock never is" if exc.errno == errno.ELOOP \
            else exc.strerror
        raise BisectError(f"cannot create the ledger's lock `{lock_path}`: {why}",
                          "remove it if it is not yours, or point --ledger (or --out) at a "
                          "writable directory of your own") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise BisectError(f"the ledger's lock `{lock_path}` is not a plain file of its own "
                          "(a FIFO, a device or a hard link): refusing to write into it",
                          "remove it if it is not yours, or point --ledger (or --out) at a "
                          "directory of your own")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise BisectError(
            f"the ledger `{path}` is in use by another bisect (PID {holder})",
            "wait for it to finish (or stop it), or give this bisect its own --ledger "
            "(or --out)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _connect(path: Path) -> sqlite3.Connection:
    conn = None
    try:
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.executescript(SCHEMA)
        found = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    except sqlite3.DatabaseError as exc:
        if conn is not None:
            conn.close()
        raise BisectError(
            f"cannot open the ledger `{path}`: {exc}",
            "point --ledger at a writable file, or move the broken one",
        ) from exc
    if found is None:
        conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
    else:
        try:
            _check_schema(path, found)
        except BisectError:
            conn.close()
            raise
    return conn


def _check_schema(path: Path, found: sqlite3.Row | None) -> None:
    if found is None or str(found[0]) != str(SCHEMA_VERSION):
        raise BisectError(
            f"ledger `{path}` has schema {found[0] if found else 'none'}, expected "
            f"{SCHEMA_VERSION}", "use a ledger written by this version of dsv4bisect")


__all__ = ["Ledger", "NoiseEstimate", "RunRow", "StepRow", "TrialKey", "TrialRow"]


def open_holding(run_dir: Path, recorded: Path, run_id: str) -> Ledger:
    """The ledger that holds bisect run `run_id` of `run_dir`, opened read-only: the one beside
    the run directory when it holds the run (a runs root copied or moved keeps its ledger there,
    `RUNS_ROOT/ledger.sqlite`), else the one the bisect recorded (`--ledger` elsewhere). Every
    reader of a bisect's directory (its report, `localise`) finds it the same way."""
    paths = [p for p in dict.fromkeys((run_dir.parent / recorded.name, recorded)) if p.is_file()]
    if not paths:
        raise BisectError(f"the ledger `{recorded}` does not exist",
                          "was it moved or deleted? keep it beside the run directory "
                          "(RUNS_ROOT/ledger.sqlite); reading a bisect creates nothing")
    for path in paths:
        ledger = Ledger.open_readonly(path)
        try:
            ledger.get_run(run_id)
        except BisectError:
            ledger.close()
            continue
        return ledger
    raise BisectError(f"no ledger holds the bisect run `{run_id}` of `{run_dir}`",
                      f"was {recorded} moved? keep it beside the run directory")
