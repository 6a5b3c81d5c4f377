"""Benchmark: a corpus of damaged run directories and ledgers against the real CLI.

Not collected by pytest (tests/hardening/test_damaged_corpus.py runs a sample of it). Two
templates are made first: a real `dsv4bisect bisect --test-cmd` run (a bisect directory and its
ledger) and a finished `run` directory (run.json, verdict.json, the arms' config.json). Each
fixture in `FIXTURES` copies one template and damages it — garbage in a ledger row's columns,
truncated settings, a dangling step, wrong-typed bisect.json fields, a truncated or zeroed
SQLite file, FIFOs and symlinks where files belong, a deleted verdict.json... — and then runs

    dsv4bisect report DIR | report DIR --json | bisect --resume DIR

as subprocesses with a time limit. A run counts

    traceback   "Traceback" on stderr, or exit 70 (the handler's "internal error")
    hang        no answer within the limit
    bad exit    an exit code outside the documented 0, 1, 2, 4, 5, 125, 130
    no hint     exit 5 (bad input) without a `hint:` line

Run (the figures in docs/performance.md came from it):

    python tests/benchmarks/damaged_runs.py --jobs 2 --json damaged.json

Exit 0 when nothing was found, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECK = HERE.parent / "bisect" / "fake_check.py"  # exits 1 when the culprit is on
ALLOWED = {0, 1, 2, 4, 5, 125, 130}
COMMANDS = (("report", "{dir}"), ("report", "{dir}", "--json"), ("bisect", "--resume", "{dir}"))
LEDGER = "ledger.sqlite"

Damage = Callable[[Path], None]  # applied to a copy of a template directory


# ---- templates -------------------------------------------------------------------------------

def make_templates(root: Path, env: dict[str, str]) -> tuple[Path, Path]:
    """(bisect template, run template) under `root`: a real bisect, a finished run's files."""
    runs = root / "bisect-template"
    log = root / "calls.log"
    cmd = f"{sys.executable} {CHECK} {log} triton-indexer"
    done = subprocess.run(
        [sys.executable, "-m", "dsv4bisect", "bisect", "--test-cmd", cmd, "--false-fail", "0",
         "--false-pass", "0", "--out", str(runs)], cwd=root, env=env, capture_output=True,
        text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the template bisect failed:\n{done.stderr[-2000:]}")
    return runs, _run_template(root / "run-template")


def _run_template(run: Path) -> Path:
    from dsv4bisect.config.resolve import resolve
    from dsv4bisect.probe.verdict import Verdict

    for arm in ("baseline", "candidate"):
        (run / arm).mkdir(parents=True)
        (run / arm / "config.json").write_text(json.dumps(resolve("reference").to_json(
            redact=False)))
    (run / "run.json").write_text(json.dumps({
        "schema": "dsv4bisect.run/1", "status": "done", "verdict": "PASS", "exit_code": 0,
        "profile": "reference", "tier": "ci", "command": ["dsv4bisect", "run", "reference"],
        "overrides": {"sets": [], "enable": [], "disable": [], "only": None}, "error": None}))
    (run / "verdict.json").write_text(json.dumps(
        Verdict("PASS", ("drift decides",), {"tier": "ci"}).to_dict()))
    return run


def bisect_dir(copy: Path) -> Path:
    """The bisect run directory inside a copy of the bisect template (its runs root)."""
    return next(p for p in copy.iterdir() if p.is_dir() and "-bisect-" in p.name)


# ---- damages ---------------------------------------------------------------------------------

def _sql(statement: str) -> Damage:
    def damage(root: Path) -> None:
        conn = sqlite3.connect(root / LEDGER)
        conn.execute(statement)
        conn.commit()
        conn.close()
    return damage


def _trial(column: str, value: object) -> Damage:
    def damage(root: Path) -> None:
        conn = sqlite3.connect(root / LEDGER)
        conn.execute(f"UPDATE trials SET {column} = ? WHERE id = (SELECT MIN(id) FROM trials)",
                     (value,))
        conn.commit()
        conn.close()
    return damage


def _step(column: str, value: object) -> Damage:
    def damage(root: Path) -> None:
        conn = sqlite3.connect(root / LEDGER)
        conn.execute(f"UPDATE steps SET {column} = ? WHERE step = 1", (value,))
        conn.commit()
        conn.close()
    return damage


def _run_row(column: str, value: object) -> Damage:
    return _sql_param(f"UPDATE runs SET {column} = ?", value)


def _sql_param(statement: str, value: object) -> Damage:
    def damage(root: Path) -> None:
        conn = sqlite3.connect(root / LEDGER)
        conn.execute(statement, (value,))
        conn.commit()
        conn.close()
    return damage


def _truncated_settings(root: Path) -> None:
    conn = sqlite3.connect(root / LEDGER)
    (settings,) = conn.execute("SELECT settings FROM runs").fetchone()
    conn.execute("UPDATE runs SET settings = ?", (settings[: len(settings) // 2],))
    conn.commit()
    conn.close()


def _settings_key(key: str, value: object) -> Damage:
    def damage(root: Path) -> None:
        conn = sqlite3.connect(root / LEDGER)
        (text,) = conn.execute("SELECT settings FROM runs").fetchone()
        settings = json.loads(text)
        if value is _DELETE:
            settings.pop(key, None)
        else:
            settings[key] = value
        conn.execute("UPDATE runs SET settings = ?", (json.dumps(settings),))
        conn.commit()
        conn.close()
    return damage


_DELETE = object()


def _ledger_bytes(make: Callable[[bytes], bytes]) -> Damage:
    def damage(root: Path) -> None:
        path = root / LEDGER
        for extra in ("-wal", "-shm"):
            Path(f"{path}{extra}").unlink(missing_ok=True)
        path.write_bytes(make(path.read_bytes()))
    return damage


def _replace_with(name_of: Callable[[Path], Path], kind: str) -> Damage:
    def damage(root: Path) -> None:
        path = name_of(root)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "dir":
            path.mkdir()
        elif kind == "symlink-etc":
            path.symlink_to("/etc/hostname")
        elif kind == "dangling":
            path.symlink_to(root / "nowhere")
        elif kind == "deleted":
            pass
    return damage


def _bisect_json(edit: Callable[[dict], object]) -> Damage:
    def damage(root: Path) -> None:
        path = bisect_dir(root) / "bisect.json"
        data = json.loads(path.read_text())
        new = edit(data)
        path.write_text(new if isinstance(new, str) else json.dumps(new))
    return damage


def _set(data: dict, dotted: str, value: object) -> dict:
    target = data
    *head, last = dotted.split(".")
    for key in head:
        target = target.setdefault(key, {})
    target[last] = value
    return data


def _run_file(name: str, text: str) -> Damage:
    def damage(root: Path) -> None:
        (root / name).write_text(text)
    return damage


def _run_json(**fields: object) -> Damage:
    def damage(root: Path) -> None:
        data = json.loads((root / "run.json").read_text())
        data.update(fields)
        (root / "run.json").write_text(json.dumps(data))
    return damage


def _both(*damages: Damage) -> Damage:
    def damage(root: Path) -> None:
        for d in damages:
            d(root)
    return damage


FIXTURES: dict[str, tuple[str, Damage]] = {
    # ledger rows: garbage in the columns the schema does not type
    "trial-verdict-garbage": ("bisect", _trial("verdict", "MAYBE")),
    "trial-verdict-number": ("bisect", _trial("verdict", 7)),
    "trial-details-not-json": ("bisect", _trial("details", "{not json")),
    "trial-details-array": ("bisect", _trial("details", "[1, 2]")),
    "trial-details-deep": ("bisect", _trial("details", "[" * 100000 + "]" * 100000)),
    "trial-patches-garbage": ("bisect", _trial("patches", "garbage")),
    "trial-patches-wrong-values": ("bisect", _trial("patches", '{"triton-indexer": 5}')),
    "trial-subset-string": ("bisect", _trial("subset", '"triton-indexer"')),
    "trial-subset-numbers": ("bisect", _trial("subset", "[1, 2]")),
    "trial-duration-text": ("bisect", _trial("duration_s", "slow")),
    "trial-started-text": ("bisect", _trial("started", "yesterday")),
    "trial-seed-block-text": ("bisect", _trial("seed_block", "x")),
    "trial-status-weird": ("bisect", _trial("status", "exploded")),
    "trial-signature-number": ("bisect", _trial("signature", 12)),
    "trial-details-error-rates": ("bisect", _trial("details", '{"error_rates": "high"}')),
    "trials-all-deleted": ("bisect", _sql("DELETE FROM trials")),
    "steps-subset-garbage": ("bisect", _step("subset", "{{")),
    "steps-outcome-maybe": ("bisect", _step("outcome", "maybe")),
    "steps-dangling-trial": ("bisect", _step("trial_id", 999999)),
    "steps-seed-block-text": ("bisect", _step("seed_block", "x")),
    "steps-all-deleted": ("bisect", _sql("DELETE FROM steps")),
    "runs-settings-truncated": ("bisect", _truncated_settings),
    "runs-settings-array": ("bisect", _run_row("settings", "[]")),
    "runs-settings-empty-object": ("bisect", _run_row("settings", "{}")),
    "runs-settings-no-candidates": ("bisect", _settings_key("candidates", _DELETE)),
    "runs-settings-candidates-number": ("bisect", _settings_key("candidates", 5)),
    "runs-settings-noise-text": ("bisect", _settings_key("noise", "loud")),
    "runs-result-garbage": ("bisect", _run_row("result", "{bad")),
    "runs-result-number": ("bisect", _run_row("result", "5")),
    "runs-row-deleted": ("bisect", _sql("DELETE FROM runs")),
    "meta-schema-future": ("bisect", _sql("UPDATE meta SET value = '99' WHERE key = 'schema'")),
    "table-steps-dropped": ("bisect", _sql("DROP TABLE steps")),
    # the ledger file itself
    "ledger-truncated": ("bisect", _ledger_bytes(lambda b: b[:100])),
    "ledger-zeroed": ("bisect", _ledger_bytes(lambda b: bytes(len(b)))),
    "ledger-garbage": ("bisect", _ledger_bytes(lambda b: os.urandom(len(b)))),
    "ledger-empty": ("bisect", _ledger_bytes(lambda b: b"")),
    "ledger-deleted": ("bisect", _replace_with(lambda r: r / LEDGER, "deleted")),
    "ledger-a-directory": ("bisect", _replace_with(lambda r: r / LEDGER, "dir")),
    "ledger-a-fifo": ("bisect", _replace_with(lambda r: r / LEDGER, "fifo")),
    "ledger-lock-symlink": ("bisect", _replace_with(lambda r: Path(f"{r / LEDGER}.lock"),
                                                    "symlink-etc")),
    "ledger-lock-fifo": ("bisect", _replace_with(lambda r: Path(f"{r / LEDGER}.lock"), "fifo")),
    # bisect.json
    "bisect-json-ledger-number": ("bisect", _bisect_json(lambda d: _set(d, "ledger", 5))),
    "bisect-json-ledger-missing-file": ("bisect", _bisect_json(
        lambda d: _set(d, "ledger", "/nonexistent/ledger.sqlite"))),
    "bisect-json-run-id-number": ("bisect", _bisect_json(lambda d: _set(d, "run_id", 5))),
    "bisect-json-run-id-unknown": ("bisect", _bisect_json(lambda d: _set(d, "run_id", "x"))),
    "bisect-json-request-string": ("bisect", _bisect_json(lambda d: _set(d, "request", "x"))),
    "bisect-json-test-cmd-number": ("bisect", _bisect_json(
        lambda d: _set(d, "request.test_cmd", 5))),
    "bisect-json-sets-number": ("bisect", _bisect_json(lambda d: _set(d, "request.sets", 5))),
    "bisect-json-command-mixed": ("bisect", _bisect_json(
        lambda d: _set(d, "request.command", ["x", 5]))),
    "bisect-json-test-cwd-gone": ("bisect", _bisect_json(
        lambda d: _set(d, "request.test_cwd", "/nonexistent/dir"))),
    "bisect-json-truncated": ("bisect", _bisect_json(lambda d: json.dumps(d)[:40])),
    "bisect-json-array": ("bisect", _bisect_json(lambda d: "[]")),
    "bisect-json-fifo": ("bisect", _replace_with(lambda r: bisect_dir(r) / "bisect.json",
                                                 "fifo")),
    # run directories
    "run-verdict-deleted": ("run", _replace_with(lambda r: r / "verdict.json", "deleted")),
    "run-verdict-fifo": ("run", _replace_with(lambda r: r / "verdict.json", "fifo")),
    "run-verdict-symlink-etc": ("run", _replace_with(lambda r: r / "verdict.json",
                                                     "symlink-etc")),
    "run-config-fifo": ("run", _replace_with(lambda r: r / "candidate" / "config.json", "fifo")),
    "run-json-fifo": ("run", _replace_with(lambda r: r / "run.json", "fifo")),
    "run-json-dangling-symlink": ("run", _replace_with(lambda r: r / "run.json", "dangling")),
    "run-verdict-nan": ("run", _run_file("verdict.json", '{"schema": "dsv4bisect.verdict/1", '
                                         '"verdict": "PASS", "reasons": [], "probe": {}, '
                                         '"drift": {"kl_mean": NaN}}')),
    "run-verdict-infinity-exit": ("run", _run_file(
        "verdict.json", '{"schema": "dsv4bisect.verdict/1", "verdict": "PASS", "reasons": [],'
                        ' "probe": {}, "exit_code": Infinity}')),
    "run-json-done-no-verdict": ("run", _both(
        _replace_with(lambda r: r / "verdict.json", "deleted"), _run_json(verdict=None))),
    "run-json-command-number": ("run", _run_json(command=5)),
    "run-json-overrides-sets-number": ("run", _run_json(overrides={"sets": 5})),
    "run-json-arms-list": ("run", _run_json(arms=[1, 2])),
    "run-config-garbage": ("run", _run_file("candidate/config.json", '{"engine": 5}')),
}


# ---- running ---------------------------------------------------------------------------------

@dataclass
class Outcome:
    fixture: str
    command: str
    code: int | None  # None: no answer within the limit
    seconds: float
    stderr_tail: str
    problems: list[str]


def make_fixture(name: str, templates: tuple[Path, Path], dest: Path) -> Path:
    """A damaged copy of the fixture's template under `dest`; the directory to pass."""
    kind, damage = FIXTURES[name]
    src = templates[0] if kind == "bisect" else templates[1]
    shutil.copytree(src, dest, symlinks=True)
    if kind == "bisect":  # the ledger path in bisect.json names the template's: point it here
        run = bisect_dir(dest)
        data = json.loads((run / "bisect.json").read_text())
        data["ledger"] = str(dest / LEDGER)
        (run / "bisect.json").write_text(json.dumps(data))
    damage(dest)
    return bisect_dir(dest) if kind == "bisect" else dest


def run_fixture(name: str, templates: tuple[Path, Path], root: Path, env: dict[str, str],
                timeout: float) -> list[Outcome]:
    target = make_fixture(name, templates, root / name)
    out = []
    for command in COMMANDS:
        argv = [sys.executable, "-m", "dsv4bisect", *(a.format(dir=target) for a in command)]
        start = time.perf_counter()
        try:
            proc = subprocess.run(argv, cwd=root, env=env, capture_output=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL, check=False)
            code, err = proc.returncode, proc.stderr.decode(errors="replace")
        except subprocess.TimeoutExpired as exc:
            code, err = None, (exc.stderr or b"").decode(errors="replace")
        problems = classify(code, err)
        out.append(Outcome(name, " ".join(command[:-1] if command[-1] == "{dir}" else command)
                           .replace(" {dir}", ""), code, time.perf_counter() - start,
                           err[-600:], problems))
    return out


def classify(code: int | None, err: str) -> list[str]:
    if code is None:
        return ["hang"]
    problems = []
    if "Traceback" in err or code == 70:
        problems.append("traceback")
    if code not in ALLOWED:
        problems.append("bad exit")
    if code == 5 and not any(line.startswith("hint: ") for line in err.splitlines()):
        problems.append("no hint")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--only", help="comma-separated fixture names")
    ap.add_argument("--json", type=Path, help="write every outcome here")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(FIXTURES)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dsv4damaged-") as tmp:
        root = Path(tmp)
        env = {**os.environ, "DSV4BISECT_CACHE": str(root / "cache"), "NO_COLOR": "1"}
        templates = make_templates(root, env)
        (root / "fixtures").mkdir()
        with ThreadPoolExecutor(args.jobs) as pool:
            outcomes = [o for batch in pool.map(
                lambda n: run_fixture(n, templates, root / "fixtures", env, args.timeout), names)
                for o in batch]
    wall = time.perf_counter() - start
    found = Counter(p for o in outcomes for p in o.problems)
    codes = Counter(o.code for o in outcomes)
    print(f"fixtures {len(names)} x {len(COMMANDS)} commands = {len(outcomes)} runs, "
          f"{args.jobs} jobs, wall {wall:.0f} s ({platform.node()}, {os.cpu_count()} CPUs)")
    print(f"tracebacks {found['traceback']}  hangs (> {args.timeout:.0f} s) {found['hang']}  "
          f"bad exits {found['bad exit']}  exit 5 without a hint {found['no hint']}  "
          f"slowest {max(o.seconds for o in outcomes):.1f} s")
    print("exit codes: " + ", ".join(f"{'timeout' if k is None else k}: {v}"
                                      for k, v in sorted(codes.items(), key=lambda kv: str(kv[0]))))
    for o in [o for o in outcomes if o.problems]:
        last = (o.stderr_tail.strip().splitlines() or [""])[-1]
        print(f"  {o.fixture} `{o.command}`: {','.join(o.problems)}: {last[:160]}")
    if args.json:
        args.json.write_text(json.dumps([o.__dict__ for o in outcomes], indent=1))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
