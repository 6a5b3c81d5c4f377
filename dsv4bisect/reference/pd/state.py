"""A request's decoding state as the named buffers a PD transfer moves, and back.

SGLang's DeepSeek-V4 pool (`mem_cache/deepseek_v4_memory_pool.py`, 0.5.13) registers two kinds
of buffers with the transfer engine, and the embedded state (`reference/cache.py`) splits the
same way:
- **KV** (`get_contiguous_buf_infos`: the c4 and c128 KV pools and the c4 indexer's key pool):
  every compressed entry of a layer's compressor (`layers.N.c{ratio}_kv` [m, head_dim]) and the
  indexer's compressed keys (`layers.N.c4_indexer_k` [m, index_head_dim]). Sent by the backend's
  KV transfer (`send_kv`).
- **state** (`get_state_buf_infos`: the SWA KV pool, the compress-state pools and the indexer's
  compress-state pools): the sliding window's K=V rows (`layers.N.swa_kv` [k, head_dim], the
  last k = min(window - 1, n) positions), each compressor's open window (`pending_kv`,
  `pending_score` [n mod ratio, coff·d]) and, for the overlapping ratio-4 scheme, the previous
  window's first half (`prev_kv`, `prev_score` [ratio, d], once a window is complete), for the
  attention's compressor (`compress_state`) and the indexer's (`indexer_compress_state`); with
  speculation, the MTP layer's own window (`mtp.swa_kv`). Sent apart from the KV, by the
  backend's `maybe_send_extra` (where sglang PR #24878's Mooncake bug lost it).
- **aux** (SGLang's metadata buffers): the MTP layer's pending streams (`mtp.h`, EAGLE's hidden
  states) and, in the header, the token count, the first output token with its log-probs and
  the prompt tokens the prefill server's prefix cache gave.

Every buffer is float32 (the `deployment` precision keeps FP8-rounded values in fp32), so a
transfer is bit-exact: `restore(export(cache))` holds the same values (tested).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dsv4bisect.reference.cache import CompressorState, LayerCache, ModelCache

KV, STATE, AUX = "kv", "state", "aux"
CATEGORIES = (KV, STATE, AUX)
COMPRESS_STATE = "compress_state"
INDEXER_COMPRESS_STATE = "indexer_compress_state"
TAIL_FIELDS = ("pending_kv", "pending_score", "prev_kv", "prev_score")


@dataclass(frozen=True)
class Header:
    """What travels beside the buffers: the state's token count, the MTP layer's row count
    (None: no MTP state), the first output token (None: a scoring-only request, none chosen)
    with its log-prob and top alternatives, and the prompt tokens the prefix cache gave."""

    n_tokens: int
    mtp_rows: int | None = None
    first_token: int | None = None
    first_logprob: float = 0.0
    first_top: tuple[tuple[int, float], ...] = ()
    cached_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"n_tokens": self.n_tokens, "mtp_rows": self.mtp_rows,
                "first_token": self.first_token, "first_logprob": self.first_logprob,
                "first_top": [list(t) for t in self.first_top],
                "cached_tokens": self.cached_tokens}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Header:
        return cls(int(doc["n_tokens"]), None if doc.get("mtp_rows") is None
                   else int(doc["mtp_rows"]),
                   None if doc.get("first_token") is None else int(doc["first_token"]),
                   float(doc.get("first_logprob") or 0.0),
                   tuple((int(t), float(x)) for t, x in doc.get("first_top") or ()),
                   int(doc.get("cached_tokens") or 0))


@dataclass
class Payload:
    """One request's transfer: the header and its buffers by category (name -> tensor)."""

    header: Header
    buffers: dict[str, dict[str, torch.Tensor]] = field(
        default_factory=lambda: {c: {} for c in CATEGORIES})

    def nbytes(self, category: str) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers[category].values())


def export(cache: ModelCache, header: Header) -> Payload:
    """The buffers of `cache` (the state after `header.n_tokens` tokens)."""
    if cache.n_tokens != header.n_tokens:
        raise ValueError(f"a cache of {cache.n_tokens} tokens sent as {header.n_tokens}")
    out = Payload(header)
    kv, state, aux = (out.buffers[c] for c in CATEGORIES)
    for i, layer in enumerate(cache.layers):
        state[f"layers.{i}.swa_kv"] = layer.window
        for where, comp in ((COMPRESS_STATE, layer.comp), (INDEXER_COMPRESS_STATE, layer.index)):
            if comp is None:
                continue
            entries = f"layers.{i}.c4_indexer_k" if where == INDEXER_COMPRESS_STATE \
                else f"layers.{i}.c{comp.ratio}_kv"
            kv[entries] = comp.entries.view()
            for name in TAIL_FIELDS:
                value = getattr(comp, name)
                if value is not None:
                    state[f"layers.{i}.{where}.{name}"] = value
    if cache.mtp is not None:
        state["mtp.swa_kv"] = cache.mtp.layer.window
        if cache.mtp.h is not None:
            aux["mtp.h"] = cache.mtp.h
    return out


def restore(model: Any, header: Header, kv: dict[str, torch.Tensor],
            state: dict[str, torch.Tensor], aux: dict[str, torch.Tensor]) -> ModelCache:
    """A cache of `header.n_tokens` tokens from KV buffers, state buffers (as the decode server
    reads them from its slot: slots.py) and aux buffers; a missing KV buffer is an error (the
    backend lost what it must send), the state is whatever the slot gives."""
    n = header.n_tokens
    cache = model.new_cache(mtp=header.mtp_rows is not None)
    cache.n_tokens = n
    for i, layer in enumerate(cache.layers):
        _fill_layer(layer, f"layers.{i}", n, kv, state)
    if cache.mtp is not None:
        rows = int(header.mtp_rows or 0)
        cache.mtp.rows = rows
        _fill_layer(cache.mtp.layer, "mtp", rows, kv, state)
        cache.mtp.h = aux.get("mtp.h")
    return cache


def _fill_layer(layer: LayerCache, prefix: str, n: int, kv: dict[str, torch.Tensor],
                state: dict[str, torch.Tensor]) -> None:
    layer.window = state[f"{prefix}.swa_kv"]
    layer.window_start = n - layer.window.shape[0]
    for where, comp in ((COMPRESS_STATE, layer.comp), (INDEXER_COMPRESS_STATE, layer.index)):
        if comp is None:
            continue
        entries = f"{prefix}.c4_indexer_k" if where == INDEXER_COMPRESS_STATE \
            else f"{prefix}.c{comp.ratio}_kv"
        if entries not in kv:
            raise ValueError(f"the transfer carries no `{entries}`")
        _fill_tail(comp, f"{prefix}.{where}", kv[entries], state)


def _fill_tail(comp: CompressorState, prefix: str, entries: torch.Tensor,
               state: dict[str, torch.Tensor]) -> None:
    comp.entries.append(entries)
    for name in TAIL_FIELDS:
        setattr(comp, name, state.get(f"{prefix}.{name}"))
    if comp.pending_kv is None or comp.pending_score is None:
        raise ValueError(f"`{prefix}` has no open window in the state it was given")
