"""`dsv4bisect router`'s arguments: sglang-router's (`sglang_router/router_args.py`,
`python -m sglang_router.launch_router`), the part a PD deployment uses, parsed the same way.

    --pd-disaggregation --prefill URL [BOOTSTRAP_PORT] (repeatable) --decode URL (repeatable)
    --host H --port P [--policy random|round_robin|cache_aware|power_of_two]
    [--prefill-policy ...] [--decode-policy ...] [--mini-lb] [--request-timeout-secs N]
    [--cache-threshold F] [--log-level ...]

As there, the second value after `--prefill URL` is the prefill server's bootstrap port (or
`none`), the default policy is `cache_aware`, the default address 127.0.0.1:30000. Only the PD
mode is served (sglang-router's plain mode, `--worker-urls`, spreads requests over identical
servers; a profile of the embedded engine has one). A bad argument is a ConfigError (exit 5).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from urllib.parse import urlsplit

from dsv4bisect.errors import ConfigError

POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class RouterArgs:
    prefill: tuple[tuple[str, int | None], ...]  # (url, bootstrap port or None)
    decode: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 30000
    policy: str = "cache_aware"
    prefill_policy: str | None = None
    decode_policy: str | None = None
    mini_lb: bool = False
    request_timeout_secs: int = 1800
    cache_threshold: float = 0.3
    log_level: str = "info"

    def policy_of(self, role: str) -> str:
        own = self.prefill_policy if role == "prefill" else self.decode_policy
        return own or self.policy


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"router: {message}", "dsv4bisect router --help lists the "
                          "arguments (sglang-router's names)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dsv4bisect router", description=(
        "The embedded engine's PD router: sglang-router's --pd-disaggregation mode. Sends each "
        "request to a prefill and a decode server with bootstrap_host/port/room, answers with "
        "the decode server's response (input log-probs joined from the prefill server's)."))
    p.add_argument("--host", default=RouterArgs.host, help="Address to bind.")
    p.add_argument("--port", type=int, default=RouterArgs.port, help="Port to bind.")
    p.add_argument("--pd-disaggregation", action="store_true",
                   help="PD mode: --prefill and --decode servers (required).")
    p.add_argument("--prefill", nargs="+", action="append", metavar="URL [BOOTSTRAP_PORT]",
                   help="A prefill server and its bootstrap port (a number or `none`); "
                   "repeatable.")
    p.add_argument("--decode", nargs=1, action="append", metavar="URL",
                   help="A decode server; repeatable.")
    p.add_argument("--policy", choices=POLICIES, default=RouterArgs.policy)
    p.add_argument("--prefill-policy", choices=POLICIES, default=None)
    p.add_argument("--decode-policy", choices=POLICIES, default=None)
    p.add_argument("--mini-lb", action="store_true",
                   help="Accepted for sglang-router's command lines (this router is one).")
    p.add_argument("--request-timeout-secs", type=int, default=RouterArgs.request_timeout_secs)
    p.add_argument("--cache-threshold", type=float, default=RouterArgs.cache_threshold)
    p.add_argument("--log-level", choices=LOG_LEVELS, default=RouterArgs.log_level)
    return p


def parse(argv: list[str]) -> RouterArgs:
    ns = parser().parse_args(argv)
    if not ns.pd_disaggregation:
        raise ConfigError("router: only the PD mode is served here",
                          "pass --pd-disaggregation with --prefill URL [PORT] and --decode URL")
    if not ns.prefill or not ns.decode:
        raise ConfigError("router: --pd-disaggregation needs at least one --prefill and one "
                          "--decode server", "e.g. --prefill http://127.0.0.1:30000 8998 "
                          "--decode http://127.0.0.1:30001")
    prefill = tuple(_prefill(values) for values in ns.prefill)
    decode = tuple(_url(url) for (url,) in ns.decode)
    if not 0 <= ns.port <= 65535:
        raise ConfigError(f"router: --port {ns.port} is not a port", "use 0..65535")
    if ns.request_timeout_secs <= 0 or not 0.0 <= ns.cache_threshold <= 1.0:
        raise ConfigError("router: --request-timeout-secs must be positive and "
                          "--cache-threshold in [0, 1]", None)
    return RouterArgs(prefill, decode, ns.host, ns.port, ns.policy, ns.prefill_policy,
                      ns.decode_policy, ns.mini_lb, ns.request_timeout_secs, ns.cache_threshold,
                      ns.log_level)


def _prefill(values: list[str]) -> tuple[str, int | None]:
    if len(values) > 2:
        raise ConfigError(f"router: --prefill takes URL [BOOTSTRAP_PORT], got {values}",
                          "repeat --prefill for each prefill server")
    url = _url(values[0])
    if len(values) == 1 or values[1].lower() == "none":
        return url, None
    if not values[1].isdigit() or not 1 <= int(values[1]) <= 65535:
        raise ConfigError(f"router: bootstrap port {values[1]!r} of {url} is not a port",
                          "give a number in 1..65535 or `none`")
    return url, int(values[1])


def _url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"router: {url!r} is not an http(s) URL",
                          "e.g. http://127.0.0.1:30000")
    return url.rstrip("/")
