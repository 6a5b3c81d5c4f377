"""The prefix cache: a radix tree over token ids whose nodes may hold a decoding-state snapshot.

SGLang's radix cache (`mem_cache/radix_cache.py`) keeps per-token KV slots in a radix tree, so
any matched prefix is reusable. DeepSeek-V4's decoding state is not only per-token rows: the
compressors' pending windows and overlap halves and the sliding window describe the state *at*
one token count, and cannot be cut back to a shorter prefix. This cache therefore works like
SGLang's state-carrying trees (`mamba_radix_cache.py`: a node's state is valid only where it was
inserted, a node created by splitting an edge has none, and a match ends at the deepest node that
has one) — which is also why SGLang's DeepSeek-V4 pool keeps compressor state per SWA page
(`mem_cache/compress_state.py`) rather than per token. Here a snapshot is a `ModelCache.fork()`
(all layers' window rows, compressor and indexer state, entries shared copy-on-write), taken by
the scheduler where a later request can continue: at the end of each prompt and of each output.

A snapshot taken where a prompt ended also keeps the logits of the prompt's last position, the
next-token distribution after it. SGLang serves the same prompt sent again (a client retry, a
regenerate) from its radix tree and recomputes only the last token, cutting the match back by one
token of per-token KV; a snapshot here holds the state at one token count and cannot be cut back,
so a request whose whole prompt is a snapshot with logits (`match(..., whole=True)`) resumes at
its end and takes its first token from those logits: no token is computed, and the answer is the
one the request that left the snapshot got, bit for bit.

Bounded by `budget_bytes`: `nbytes` is every allocation the snapshots keep alive — each tensor's
whole storage (an entry buffer's capacity, not its rows), the window, the compressors' and the
indexer's pending and previous-window rows, the MTP state, the kept logits — each storage counted
once however many snapshots share it (`cache.held_storages`, reference-counted here). Beyond the
budget the least recently used snapshots are dropped, and nodes left with neither snapshot nor
children are pruned; a dropped or flushed snapshot is referenced nowhere else, so its memory goes
back (`reference/heap.py` returns the freed pages to the system after a flush). A snapshot larger
than the whole budget is not kept. Thread-safe (one lock).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from dsv4bisect.reference import heap
from dsv4bisect.reference.cache import ModelCache, held_storages

DEFAULT_BUDGET_BYTES = 1 << 30  # 1 GiB of snapshots (the tiny/small models' states are ~KiB-MiB)


@dataclass(eq=False)
class _Node:
    key: tuple[int, ...]  # the edge's tokens from the parent
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)  # first token -> child
    snapshot: ModelCache | None = None
    logits: torch.Tensor | None = None  # [V] after the snapshot's last token (a prompt's end)
    held: dict[tuple[str, int], int] = field(default_factory=dict)  # storage -> bytes
    last_used: int = 0


@dataclass(frozen=True)
class Match:
    tokens: int  # prefix length the snapshot covers (0: no hit)
    cache: ModelCache | None  # a private fork of the snapshot (None: no hit)
    logits: torch.Tensor | None = None  # [V]: a whole-prompt hit's next-token logits


class PrefixCache:
    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be positive, got {budget_bytes}")
        self.budget = budget_bytes
        self._lock = threading.Lock()
        self._clock = itertools.count(1)
        self._root = _Node((), None)
        self._snapshots: set[_Node] = set()
        self._refs: dict[tuple[str, int], int] = {}  # storage -> snapshots holding it
        self.nbytes = 0  # the bytes of the storages in _refs

    def __len__(self) -> int:
        return len(self._snapshots)

    def match(self, ids: Sequence[int], limit: int, *, whole: bool = False) -> Match:
        """The longest snapshot of a prefix of `ids` no longer than `limit` tokens; with
        `whole`, a snapshot of all of `ids` that kept its logits comes first (a request that
        generates resumes at its end; its `logits` are in the match)."""
        with self._lock:
            node, depth, best, best_depth = self._root, 0, None, 0
            end = len(ids) if whole else min(len(ids), limit)
            while depth < end:
                child = node.children.get(ids[depth])
                if child is None or tuple(ids[depth : depth + len(child.key)]) != child.key:
                    break
                node, depth = child, depth + len(child.key)
                if node.snapshot is None:
                    continue
                if depth <= limit or (depth == len(ids) and whole and node.logits is not None):
                    best, best_depth = node, depth
            if best is None:
                return Match(0, None)
            best.last_used = next(self._clock)
            logits = best.logits if whole and best_depth == len(ids) else None
            return Match(best_depth, best.snapshot.fork(), logits)

    def insert(self, ids: Sequence[int], cache: ModelCache,
               logits: torch.Tensor | None = None) -> None:
        """Keep a snapshot of `cache`, the state after exactly `ids`, with the logits [V] of
        its last position where a prompt ended there (None elsewhere)."""
        if cache.n_tokens != len(ids) or not ids:
            raise ValueError(f"a cache of {cache.n_tokens} tokens keyed by {len(ids)} ids")
        snap = cache.fork()
        held = held_storages([*snap.tensors(), *([] if logits is None else [logits])])
        if sum(held.values()) > self.budget:
            return
        with self._lock:
            node = self._node_for(tuple(ids))
            if node.snapshot is not None:
                self._release(node)
            else:
                self._snapshots.add(node)
            node.snapshot, node.logits, node.held = snap, logits, held
            node.last_used = next(self._clock)
            for key, size in held.items():
                self._refs[key] = self._refs.get(key, 0) + 1
                self.nbytes += size if self._refs[key] == 1 else 0
            evicted = self.nbytes > self.budget
            while self.nbytes > self.budget:
                self._drop(min(self._snapshots, key=lambda n: n.last_used))
        if evicted:
            heap.give_back()

    def flush(self) -> None:
        with self._lock:
            for node in self._snapshots:  # now: the tree's parent links wait for the collector
                node.snapshot, node.logits, node.held = None, None, {}
            self._root, self._snapshots, self._refs, self.nbytes = _Node((), None), set(), {}, 0
        heap.give_back()

    def _node_for(self, ids: tuple[int, ...]) -> _Node:
        """The node whose path is exactly `ids`, splitting an edge or adding a leaf."""
        node, depth = self._root, 0
        while depth < len(ids):
            child = node.children.get(ids[depth])
            if child is None:
                leaf = _Node(ids[depth:], node)
                node.children[ids[depth]] = leaf
                return leaf
            common = _common(child.key, ids[depth:])
            if common < len(child.key):  # split: a new node at the fork point, no snapshot
                mid = _Node(child.key[:common], node)
                node.children[ids[depth]] = mid
                child.key, child.parent = child.key[common:], mid
                mid.children[child.key[0]] = child
                child = mid
            node, depth = child, depth + common
        return node

    def _release(self, node: _Node) -> None:
        """Stop counting the storages only this node's snapshot held."""
        for key, size in node.held.items():
            self._refs[key] -= 1
            if self._refs[key] == 0:
                del self._refs[key]
                self.nbytes -= size
        node.snapshot, node.logits, node.held = None, None, {}

    def _drop(self, node: _Node) -> None:
        self._snapshots.discard(node)
        self._release(node)
        while node.parent is not None and node.snapshot is None and not node.children:
            del node.parent.children[node.key[0]]
            node = node.parent


def _common(a: tuple[int, ...], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
