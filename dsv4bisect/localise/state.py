"""State, not activations: the decoding state a prefix-cache hit restores, compared against the
cold prefill of the same prefix (what SGLang's `--kv-canary` does with the real KV bytes).

A restore changes no activation of the forward that follows it until that forward reads the
restored rows; the activation sites then show the reading op first (the attention kernel), not
the restore. So the state itself is captured, per layer and position, as sites of a `Capture`
(`state_capture`), and judged by the same rule (`judge.localise`): the reference is the cold
state, the candidate the restored one, and the envelope comes from the good end doing the same
(its hit, and its prefix prefilled in other chunks).

The hit is the scheduler's own (`reference/scheduler.py`): the cold state is put into a prefix
cache as a snapshot, a request that extends the prompt by its next token is admitted (the
longest cached prefix: the whole prompt; a fault of the restore path acts here, e.g. the
`swa-ring-stale` slot ring), and its state after that one token's prefill is read back. The
positions both states hold are compared (the new token's rows have no cold counterpart).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from dsv4bisect.localise.sites import Capture, Site, SiteRows

_SLOTS = ("pending_kv", "pending_score", "prev_kv", "prev_score")


def state_capture(caches: Mapping[int, Any], model: torch.nn.Module, label: str = "") -> Capture:
    """Every layer's decoding state of each sequence's cache as sites: the sliding window's K=V
    rows (`state.swa_window`, at their positions), each compressor's pending window and previous
    half (`state.compressor`) and its entries (`state.entries`, the indexer's:
    `state.indexer_keys`), each entry at the position of the token that completed it."""
    cap = Capture(label=label)

    def put(module: str, op: str, slot: str, seq: int, pos: np.ndarray, rows: torch.Tensor
            ) -> None:
        key = f"{module}:{op}:{slot}"
        if key not in cap.sites:
            cap.sites[key] = Site(key, module, op, slot, len(cap.sites))
            cap.rows[key] = SiteRows()
        if len(pos):
            cap.rows[key].add(seq, pos, rows.detach().reshape(len(pos), -1).float().numpy().copy())

    for i in range(len(model.layers)):
        for seq, cache in caches.items():
            lc = cache.layers[i]
            n = lc.window.shape[0]
            put(f"layers.{i}.attn", "state.swa_window", "0", seq,
                np.arange(lc.window_start, lc.window_start + n), lc.window)
            for sub, state, entries_op in (("attn.compressor", lc.comp, "state.entries"),
                                           ("attn.indexer.compressor", lc.index,
                                            "state.indexer_keys")):
                if state is None:
                    continue
                module = f"layers.{i}.{sub}"
                r, done = state.ratio, state.n_entries
                pending = state.pending_kv.shape[0]
                start = done * r
                for slot in _SLOTS[:2]:
                    put(module, "state.compressor", slot, seq,
                        np.arange(start, start + pending), getattr(state, slot))
                if state.prev_kv is not None:
                    for slot in _SLOTS[2:]:
                        put(module, "state.compressor", slot, seq,
                            np.arange(start - r, start), getattr(state, slot))
                put(module, entries_op, "0", seq, (np.arange(done) + 1) * r - 1,
                    state.entries.view())
    return cap


def hit_state(scheduler_cls: Any, engine: Any, ids: tuple[int, ...], prompt: int,
              cold: Any, *, chunk: int, spec: Any = None) -> Any:
    """The cache of a request admitted on a prefix-cache hit of `ids[:prompt]` (whose cold
    state is `cold`), after the prefill of its one remaining token `ids[prompt]`."""
    from dsv4bisect.reference.prefix_cache import PrefixCache
    from dsv4bisect.reference.request import Request

    cache = PrefixCache()
    cache.insert(ids[:prompt], cold.fork())
    sched = scheduler_cls(engine, chunk_size=chunk, prefix_cache=cache, background=False,
                          spec=spec)
    req = Request(tuple(ids[:prompt + 1]), 2, frozenset())
    sched.submit(req)
    with torch.inference_mode():
        sched.step()  # admission (the hit) and the one token's prefill
    if req.cached_tokens != prompt:
        raise RuntimeError(f"the prefix cache gave {req.cached_tokens} of {prompt} tokens")
    state = req.cache.fork()
    sched.stop()
    return state
