"""State-changing routes take POST only: the embedded server's guard against cross-site requests.

A web page can make a browser send a GET anywhere without an `Origin` header (an `<img src>`, a
link, a redirect), so the server's Origin check (http_app: a foreign Origin is 403) cannot see
it. A POST from a page always carries its Origin (browsers send it on every cross-origin POST,
`null` from sandboxed frames), which that check refuses. So a route that changes the server's
state answers POST only; a GET or HEAD is 405 with `Allow: POST` and says why.

Such routes are `/flush_cache` and `/reset_prefix_cache` (`serve --api vllm`'s; POST only in
vLLM too): each empties the prefix cache and, in hot mode, applies a pending switch
(reference/switch.py); `dsv4bisect router`'s `/flush_cache` flushes every server. SGLang's `/flush_cache` takes GET and POST (every verified
release, `entrypoints/http_server.py`); dsv4bisect's client POSTs to both engines
(`probe/client.py`). The model routes are POST with a JSON body, which no page can send across
origins without a CORS preflight (which carries Origin); `/health_generate` is GET as SGLang's
and changes no state.
"""

from __future__ import annotations

STATE_CHANGING = frozenset({"/flush_cache", "/reset_prefix_cache"})
METHODS = ("POST",)


def refusal(method: str, path: str) -> str | None:
    """Why `method` may not reach `path` (None: it may)."""
    if path not in STATE_CHANGING or method in METHODS:
        return None
    return (f"{method} {path} is refused: this route changes the server's state and takes POST "
            "only (a web page can make a browser send a GET without an Origin header); "
            f"send POST {path}")
