"""`--exit-policy` and `--warn-as`: what a command's exit code means to its caller (`run`,
`probe`).

`--warn-as`: the code of a drift WARN: pass (0, the default: drift alone is not what a
`git bisect run` over a history should land on), warn (4, the verdict's own code) or fail (1).

`--exit-policy default`: the stable codes (errors.ExitCode): 0 pass, 1 fail, 4 warn (with
`--warn-as warn`), 5 bad input, 70 internal error, 125 cannot test, 130 interrupted.

`--exit-policy git-bisect` (`errors.policy_exit`): the codes `git bisect run` reads. git counts every code
from 1 to 127 but 125 as "bad", so a commit whose profile does not validate (exit 5) would be
blamed for the regression. Under this policy a verdict keeps its code (0, 1, and 4 with
`--warn-as warn`: something was measured, a crash of the candidate's engine included, which is
a FAIL), an interruption keeps 130 (git aborts the bisect on codes above 127), and every other
code — bad input, a usage error, an internal error: nothing was measured — becomes 125, which
git skips.

`main()` applies the policy to the command's final code whatever raised it (a profile error is
raised before the command's body has its arguments), so it reads the option from argv itself;
the Typer option is there for `--help` and to refuse a value it does not know.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Annotated

import typer

from dsv4bisect.errors import policy_exit

OPTION = "--exit-policy"
COMMANDS = ("run", "probe")  # the commands that take it


class WarnExit(str, Enum):
    """How a drift WARN exits (docs/run.md, "Exit codes")."""

    passed = "pass"
    warn = "warn"
    fail = "fail"


WarnAsOpt = Annotated[WarnExit, typer.Option(
    "--warn-as",
    help="The exit code of a drift WARN: pass (0, default: `git bisect run` lands on the "
         "commit that loses facts), warn (4) or fail (1). docs/run.md.")]


class ExitPolicy(str, Enum):
    default = "default"
    git_bisect = "git-bisect"


ExitPolicyOpt = Annotated[ExitPolicy, typer.Option(
    OPTION, help="default: 5 for bad input (the stable codes); git-bisect: anything that "
                 "measured nothing (bad input, a missing file, an internal error) exits 125, "
                 "which `git bisect run` skips; verdicts keep 0/1 (4 with --warn-as warn).")]


def requested(argv: Sequence[str]) -> ExitPolicy:
    """The policy `argv` asks for (`--exit-policy X` or `--exit-policy=X`, only for the commands
    that take it); the default for anything else, a value Typer then refuses included."""
    if not argv or argv[0] not in COMMANDS:
        return ExitPolicy.default
    for i, token in enumerate(argv):
        if token == "--":
            break
        value = None
        if token == OPTION and i + 1 < len(argv):
            value = argv[i + 1]
        elif token.startswith(OPTION + "="):
            value = token[len(OPTION) + 1:]
        if value == ExitPolicy.git_bisect.value:
            return ExitPolicy.git_bisect
    return ExitPolicy.default


def exit_code(policy: ExitPolicy, code: int) -> int:
    """The process exit code of a command that ended with `code` under `policy`."""
    return policy_exit(code, policy.value)


def note(policy: ExitPolicy, code: int) -> str | None:
    """The line that says why the exit code is not the command's own (None: it is)."""
    final = exit_code(policy, code)
    if final == code:
        return None
    return (f"exit {final} instead of {code} (--exit-policy git-bisect): nothing was measured, "
            "so `git bisect run` skips this commit")
