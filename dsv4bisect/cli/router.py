"""`dsv4bisect router`: sglang-router's PD mode in front of embedded prefill/decode servers.

The arguments are sglang-router's (`python -m sglang_router.launch_router --pd-disaggregation
--prefill URL BOOTSTRAP_PORT --decode URL --host H --port P --policy ...`), parsed as it parses
them (argparse: `--prefill URL [PORT]` repeats), so a profile's router argv reads the same for
both (reference/pd/router_args.py)."""

from __future__ import annotations

from typing import Any

import typer

CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def register(app: typer.Typer) -> None:
    app.command("router", context_settings=CONTEXT, add_help_option=False)(router)


def router(ctx: typer.Context) -> None:
    """Route requests to a prefill and a decode server (sglang-router's PD arguments; --help)."""
    from dsv4bisect.reference.stop_signal import StopSignal

    signals = StopSignal.install()  # first: a SIGTERM right after the launch is kept
    try:
        from dsv4bisect.cli.serve import log_requests_to_stderr
        from dsv4bisect.reference.pd import router_args
        from dsv4bisect.reference.pd.router import build_router
        from dsv4bisect.reference.server import serve
        from dsv4bisect.reference.serving import ServeOptions

        args = router_args.parse(list(ctx.args))
        log_requests_to_stderr()
        opts = ServeOptions(host=args.host, port=args.port, api="sglang-router")
        serve(opts, _ready(args), signals, loader=build_router(args))
    finally:
        signals.close()
    if signals.received is not None:
        from dsv4bisect.reference.stop_signal import exit_now

        exit_now()


def _ready(args: Any) -> Any:
    def on_ready(url: str, info: dict[str, Any]) -> None:
        del info
        from dsv4bisect.ui.console import console

        prefill = ", ".join(f"{u} (bootstrap {p or 'default'})" for u, p in args.prefill)
        console().print(f"ready: dsv4bisect router on {url} (PD: prefill {prefill}; decode "
                        f"{', '.join(args.decode)}; policy {args.policy})",
                        markup=False, highlight=False)
        console().file.flush()

    return on_ready
