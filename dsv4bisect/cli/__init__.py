"""The `dsv4bisect` command line: Typer on top; a command parses, calls the layers below, renders.

Each command module exposes `register(app)`. A `Dsv4BisectError` becomes `error:` + `hint:` and its
exit code; Ctrl-C exits 130; anything else is a bug (traceback, exit 70). Importing this module
imports no torch (a test holds this).
"""

from __future__ import annotations

import sys
from typing import NoReturn

import typer

from dsv4bisect.errors import Dsv4BisectError, ExitCode

# command -> its module under dsv4bisect.cli, in the order `--help` lists them
COMMANDS = {"patches": "patches", "profile": "profile", "diff-config": "diff", "run": "run",
            "bisect": "bisect", "localise": "localise", "probe": "probe", "report": "report",
            "microtest": "microtest", "doctor": "doctor", "switches": "switches", "serve": "serve",
            "router": "router"}


def build_app(commands: list[str] | None = None) -> typer.Typer:
    """The Typer app with `commands` (default: all). `main` registers only the command it runs:
    importing every command module costs ~1 s of CPU (the bisect's), which `doctor` or
    `profile show` need not pay."""
    from importlib import import_module

    new = typer.Typer(
        name="dsv4bisect",
        help="Find which speed patch (or interaction) breaks long-context coherence in "
             "DeepSeek-V4.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_show_locals=False,
        rich_markup_mode=None,
    )

    @new.callback()
    def _group() -> None:
        """A group even with one command registered: `dsv4bisect doctor X` keeps its name."""

    for name in commands or list(COMMANDS):
        import_module(f"dsv4bisect.cli.{COMMANDS[name]}").register(new)
    return new


def __getattr__(name: str) -> typer.Typer:
    """`from dsv4bisect.cli import app`: the app with every command, built on first use."""
    if name == "app":
        built = build_app()
        globals()["app"] = built
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _app_for(argv: list[str]) -> typer.Typer:
    """Only the command named first (the common case); every command otherwise (`--help`, no
    command, or a misspelled one, which click answers with the names it knows)."""
    if argv and argv[0] in COMMANDS:
        return build_app([argv[0]])
    return build_app()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the command, then exit with its code as `--exit-policy`
    says (`cli/exit_policy.py`; the default keeps every code)."""
    from dsv4bisect.cli import exit_policy

    args = sys.argv[1:] if argv is None else list(argv)
    code = _run(args)
    policy = exit_policy.requested(args)
    said = exit_policy.note(policy, code)
    if said is not None:
        print(said, file=sys.stderr)
    sys.exit(exit_policy.exit_code(policy, code))


def _run(args: list[str]) -> int:
    """The command's own exit code. A `Dsv4BisectError` is printed as `error:` + `hint:` and
    exits with its code; Ctrl-C exits 130; anything else is a bug (traceback, 70)."""
    from dsv4bisect.ui.console import error

    try:
        # standalone_mode=False: click returns a command's exit code instead of exiting, and
        # lets our own errors through to be printed as `error:` + `hint:`.
        code = _app_for(args)(args=args, standalone_mode=False)
    except Dsv4BisectError as exc:
        from dsv4bisect.redact import redact_text

        error(redact_text(exc.message, ()), exc.hint)  # `--set X_TOKEN=v` may be in it
        return int(exc.exit_code)
    except KeyboardInterrupt:
        error("interrupted")
        return int(ExitCode.INTERRUPTED)
    except SystemExit as exc:
        if _reader_left():
            _quiet_exit()
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        raise
    except BrokenPipeError:
        _quiet_exit()
    except Exception as exc:  # noqa: BLE001 - click usage errors, storage failures and bugs
        from dsv4bisect.base.storage import storage_failure

        storage = storage_failure(exc)
        if storage is not None:  # a full disk or a lost permission mid-run: infrastructure
            error(storage.message, storage.hint)
            return int(storage.exit_code)
        return _handle_other(exc)
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _quiet_exit()
    return code if isinstance(code, int) else 0


def _reader_left() -> bool:
    """Click answers a closed stdout (`| head -2`) with exit 1 after wrapping stdout in its
    PacifyFlushWrapper; that is how we recognise it."""
    return type(sys.stdout).__name__ == "PacifyFlushWrapper"


def _quiet_exit() -> NoReturn:
    """The reader of stdout took what it wanted and closed the pipe (`| head -2`): that is not
    an error, so exit 0 like a complete print (the run directory keeps every result), and send
    what is still buffered to /dev/null so the interpreter's last flush does not fail."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno())
    except (OSError, AttributeError, ValueError):
        pass
    sys.exit(0)


def _handle_other(exc: Exception) -> int:
    # Click's usage errors (Typer vendors Click in recent releases, so match by shape).
    show = getattr(exc, "show", None)
    if callable(show) and isinstance(getattr(exc, "exit_code", None), int):
        show()
        return int(exc.exit_code)  # type: ignore[attr-defined]
    if type(exc).__name__ == "Abort":
        return int(ExitCode.INTERRUPTED)
    import traceback

    traceback.print_exception(exc)
    print("internal error: this is a dsv4bisect bug; please report it with the traceback above",
          file=sys.stderr)
    return int(ExitCode.INTERNAL)
