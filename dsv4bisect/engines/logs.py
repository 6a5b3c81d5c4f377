"""Engine logs: tails for error messages, and redaction of secrets before they are kept.

The policy (what is a secret, how it is hidden) is `dsv4bisect/redact.py`, shared with every
other output; this module applies it to log files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from dsv4bisect import redact

REDACTED = redact.REDACTED


def tail(path: Path, lines: int = 20, max_bytes: int = 64_000) -> str:
    """The last `lines` lines of a log (reads at most `max_bytes` from the end)."""
    try:
        if not path.is_file():  # a FIFO would block the open, and has no end to seek to
            return ""
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def last_line(path: Path, skip_polls_of: Iterable[str] = ()) -> str:
    """The last log line that says something: access-log lines of the launcher's own
    readiness polls (`GET /health_generate`, in the embedded server's and uvicorn's formats)
    are skipped, so a live view shows what the engine is doing, not that it was asked."""
    paths = {p for p in (*skip_polls_of, "/health", "/health_generate") if p}
    poll = re.compile(r"\b(?:GET|HEAD) (?:" + "|".join(re.escape(p) for p in sorted(paths))
                      + r")(?=[\s?\"]|$)")
    for line in reversed(tail(path, 200).splitlines()):
        if line.strip() and not poll.search(line):
            return line
    return ""


def secret_values(*envs: Mapping[str, str], argv: Iterable[str] = ()) -> list[str]:
    """Values of secret-named variables (TOKEN, KEY, SECRET, PASSWORD) and of secret flags in
    `argv` (`--api-key X`), longest first."""
    values = {v for v in [*redact.env_secrets(*envs), *redact.argv_secrets(argv)]
              if len(v) >= redact.MIN_SECRET}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str]) -> str:
    return redact.redact_text(text, secrets)


def redact_file(path: Path, secrets: Iterable[str]) -> None:
    secrets = list(secrets)
    if not secrets or not path.is_file():
        return
    text = path.read_text(errors="replace")
    clean = redact_text(text, secrets)
    if clean != text:
        path.write_text(clean)
