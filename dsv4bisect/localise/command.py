"""The `localise` command lines other commands print (a bisect after FOUND; `run` after FAIL)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path


def bisect_command(run_dir: str | Path) -> list[str]:
    """`dsv4bisect localise BISECT_DIR`: the bisect's bad end and culprit, the cases it lost."""
    return ["dsv4bisect", "localise", str(run_dir)]


def profile_command(profile: str, *, only: Sequence[str] = (), sets: Sequence[str] = (),
                    culprit: Sequence[str] = ()) -> list[str]:
    """`dsv4bisect localise PROFILE [--only P,Q] [--set K=V ...] [--culprit P,Q]`."""
    argv = ["dsv4bisect", "localise", profile]
    if only:
        argv += ["--only", ",".join(only)]
    for item in sets:
        argv += ["--set", item]
    if culprit:
        argv += ["--culprit", ",".join(culprit)]
    return argv


def shell(argv: Sequence[str]) -> str:
    """The command as one line a shell takes back."""
    return shlex.join(argv)
