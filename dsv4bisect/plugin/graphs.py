"""CUDA graphs on a hot switch: re-capture the decode graphs through SGLang's own entry point.

A captured decode graph replays its kernels without running the Python that chose them, so a
hook (or an `envs.X.get()` branch) switched after capture would not act on decode. SGLang
itself re-captures the decode graphs when `update_weights_from_disk(recapture_cuda_graph=True)`
changes the weights; the plugin calls the same `ModelRunner` method after a switch, so hot
trials run in the deployment's own graph mode (docs/hot-switching.md, "SGLang"). The method per
release, read from every verified wheel (tests/sglang/test_hot_static.py):

- 0.5.13 – 0.5.13.post1: `init_device_graphs` (the graph runner is `graph_runner`);
- 0.5.14 – 0.5.21: `init_decode_cuda_graph` (`update_weights_from_disk` calls it in 0.5.14 –
  0.5.15.post1; from 0.5.16 ModelRunner hands it to its weight updater as
  `recapture_cuda_graph=`);
- 0.5.22 – 0.5.23: `recapture_decode_cuda_graph` (handed over the same way).

Prefill graphs are not re-captured by SGLang's entry, so a switch refuses while one is captured
(0.5.13 `piecewise_cuda_graph_runner`, later `prefill_cuda_graph_runner`). DeepSeek-V4 is on
every release's piecewise-graph deny list (`piecewise_cuda_graph_disabled_model_archs`), so
the default launch has none. Imports no torch and no SGLang.
"""

from __future__ import annotations

from typing import Any

from dsv4bisect.base.versions import parse_version

# (first release, method name, attribute holding the decode graph runner)
RECAPTURE = (
    ((0, 5, 13), "init_device_graphs", "graph_runner"),
    ((0, 5, 14), "init_decode_cuda_graph", "decode_cuda_graph_runner"),
    ((0, 5, 22), "recapture_decode_cuda_graph", "decode_cuda_graph_runner"),
)
PREFILL_RUNNERS = ("piecewise_cuda_graph_runner", "prefill_cuda_graph_runner")


class GraphError(RuntimeError):
    """The switch cannot leave the graphs consistent with the new state in this process."""


def recapture_entry(version: str | tuple[int, ...] | None) -> tuple[str, str] | None:
    """(ModelRunner method, decode runner attribute) for a release; None before 0.5.13."""
    parsed = parse_version(version) if isinstance(version, str) else version
    if parsed is None:
        return None
    found = None
    for first, method, attr in RECAPTURE:
        if parsed[:3] >= first:
            found = (method, attr)
    return found


def hot_server_args(version: str | tuple[int, ...] | None) -> tuple[str, ...]:
    """Server args a hot engine needs on top of the deployment's own: none where SGLang has a
    re-capture entry (the hot trial keeps the deployment's graph mode); otherwise eager."""
    return () if recapture_entry(version) is not None else ("--disable-cuda-graph",)


def _captured(runner: Any, attr: str) -> bool:
    graph = getattr(runner, attr, None)
    return graph is not None and graph is not getattr(runner, "eager_runner", None)


def refresh_graphs(model_runner: Any, version: str, has_draft: bool) -> str:
    """Re-capture this process's decode graphs after a switch. Returns "recaptured", or
    "eager" when the engine runs without decode graphs; raises GraphError where it cannot."""
    entry = recapture_entry(version)
    if entry is None:
        raise GraphError(f"no known CUDA-graph re-capture entry for SGLang {version}")
    method, attr = entry
    prefill = [a for a in PREFILL_RUNNERS if _captured(model_runner, a)]
    if prefill:
        raise GraphError(f"a prefill CUDA graph is captured ({prefill[0]}), which SGLang's "
                         "re-capture entry does not renew; launch hot engines without prefill "
                         "graphs")
    if not _captured(model_runner, attr):
        return "eager"
    if has_draft:
        raise GraphError("speculative decoding: the draft model's graphs are not re-captured "
                         "by the switch; run hot trials without speculative decoding")
    getattr(model_runner, method)()
    return "recaptured"
