"""One error hierarchy and the stable exit codes (DESIGN §9).

A `Dsv4BisectError` is something the user can act on: the CLI prints `error: <message>` and
`hint: <next step>` on one or two lines, with no traceback, and exits with the error's code.
Anything else escaping a command is a bug (exit 70, traceback).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # pass / identical / culprit found
    FAIL = 1  # probe FAIL / configurations differ
    USAGE = 2  # reserved for Typer usage errors
    WARN = 4  # drift only
    BAD_INPUT = 5  # profile, arguments, unknown patch
    INTERNAL = 70
    CANNOT_TEST = 125  # infrastructure: port busy, health timeout, unreachable
    INTERRUPTED = 130


# `--exit-policy` (run, probe; cli/exit_policy.py): `default` keeps every code above;
# `git-bisect` gives `git bisect run` the codes it reads. git counts every code from 1 to 127
# but 125 as "bad", so there a code that is no verdict (bad input, a usage or internal error:
# nothing was measured) becomes 125, which git skips; a verdict (0, 1, 4), 125 and 130 (git
# aborts on codes above 127) are kept.
EXIT_POLICIES = ("default", "git-bisect")
_KEPT_UNDER_GIT_BISECT = frozenset({ExitCode.OK, ExitCode.FAIL, ExitCode.WARN,
                                    ExitCode.CANNOT_TEST, ExitCode.INTERRUPTED})


def policy_exit(code: int, policy: str = "default") -> int:
    """The process exit code of a command whose own code is `code`, under `policy`."""
    if policy == "git-bisect" and code not in _KEPT_UNDER_GIT_BISECT:
        return int(ExitCode.CANNOT_TEST)
    return code


# The last resort for a bad-input error raised without a hint of its own: every exit 5 prints
# a `hint:` line (the fuzzer counts those that do not).
GENERIC_HINT = "see `dsv4bisect COMMAND --help`; docs/reliability.md explains each exit code"


class Dsv4BisectError(Exception):
    """An error the user can fix; printed without a traceback."""

    exit_code: ExitCode = ExitCode.BAD_INPUT

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint if hint or self.exit_code != ExitCode.BAD_INPUT else GENERIC_HINT

    def __str__(self) -> str:
        return self.message


class ConfigError(Dsv4BisectError):
    """A profile or override is invalid. `message` starts with `file:line:col:` when known."""


class PatchError(Dsv4BisectError):
    """Unknown patch or variant, a malformed patch list, or a patch that did not take effect."""


class EngineError(Dsv4BisectError):
    """The engine could not be tested: port busy, health timeout, unreachable (exit 125)."""

    exit_code = ExitCode.CANNOT_TEST


class ProbeError(Dsv4BisectError):
    """The probe cannot run at all (bad spec, server unusable)."""

    exit_code = ExitCode.CANNOT_TEST


class BisectError(Dsv4BisectError):
    """The search cannot proceed: endpoints do not differ, state is corrupt or incompatible."""


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """Return ' Did you mean `x`?' for the closest choice, or None."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else None
