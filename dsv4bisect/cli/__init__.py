"""The `dsv4bisect` command line: Typer on top, one domain call per command.

Each command module exposes `register(app)`. A `Dsv4BisectError` becomes `error:` + `hint:` and its
exit code; Ctrl-C exits 130; anything else is a bug (traceback, exit 70). Importing this module
imports no torch (a test holds this).
"""

from __future__ import annotations

import sys

import typer

from dsv4bisect.errors import Dsv4BisectError, ExitCode

app = typer.Typer(
    name="dsv4bisect",
    help="Find which speed patch (or interaction) breaks long-context coherence in DeepSeek-V4.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
)


def _register_commands() -> None:
    from dsv4bisect.cli import (
        bisect,
        diff,
        doctor,
        microtest,
        patches,
        probe,
        profile,
        report,
        run,
        serve,
    )

    for module in (patches, profile, diff, run, bisect, probe, report, microtest, doctor,
                   serve):
        module.register(app)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    from dsv4bisect.ui.console import error

    try:
        # standalone_mode=False: click returns a command's exit code instead of exiting, and
        # lets our own errors through to be printed as `error:` + `hint:`.
        code = app(args=argv, standalone_mode=False)
    except Dsv4BisectError as exc:
        from dsv4bisect.redact import redact_text

        error(redact_text(exc.message, ()), exc.hint)  # `--set X_TOKEN=v` may be in it
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        error("interrupted")
        sys.exit(int(ExitCode.INTERRUPTED))
    except SystemExit:
        raise
    except Exception as exc:  # noqa: BLE001 - click usage errors, storage failures and bugs
        from dsv4bisect.storage import storage_failure

        storage = storage_failure(exc)
        if storage is not None:  # a full disk or a lost permission mid-run: infrastructure
            error(storage.message, storage.hint)
            sys.exit(int(storage.exit_code))
        _handle_other(exc)
    sys.exit(code if isinstance(code, int) else 0)


def _handle_other(exc: Exception) -> None:
    # Click's usage errors (Typer vendors Click in recent releases, so match by shape).
    show = getattr(exc, "show", None)
    if callable(show) and isinstance(getattr(exc, "exit_code", None), int):
        show()
        sys.exit(exc.exit_code)  # type: ignore[attr-defined]
    if type(exc).__name__ == "Abort":
        sys.exit(int(ExitCode.INTERRUPTED))
    import traceback

    traceback.print_exception(exc)
    print("internal error: this is a dsv4bisect bug; please report it with the traceback above",
          file=sys.stderr)
    sys.exit(int(ExitCode.INTERNAL))
