"""Which node runs which shard of one sharded probe, and what came back (pure; docs/cluster.md,
"Sharded probes").

The driver deals the shards of a probe (probe/shards.py) to the nodes that run the trial's
configuration, one shard per node at a time. A node lost mid-shard gives its shard back: it is
re-run, whole, on the next free node (the shard's requests are fixed by the seed, so the re-run
asks for exactly the same ones). A result is accepted only from the node that holds the shard
now: a late answer from a node already declared lost is dropped, and a shard is never taken
twice — so no request is counted twice and none is missing when the shards are merged.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

N = TypeVar("N", bound=Hashable)  # a node (slot) handle
R = TypeVar("R")  # what a shard gives back (a ProbeRun)


@dataclass
class ShardBook(Generic[N, R]):
    """The shards 0..count-1 of one probe: pending, running on a node, or done."""

    count: int
    pending: list[int] = field(init=False)
    running: dict[int, N] = field(default_factory=dict, init=False)
    done: dict[int, R] = field(default_factory=dict, init=False)
    history: list[tuple[int, N, str]] = field(default_factory=list, init=False)  # shard, node,
    # "start" / "done" / "lost" / "dropped", in order

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"{self.count} shards")
        self.pending = list(range(self.count))

    @property
    def complete(self) -> bool:
        return len(self.done) == self.count

    def deal(self, free: Iterable[N]) -> list[tuple[int, N]]:
        """Pending shards to free nodes (lowest shard first, nodes in the order given)."""
        out = []
        for node in free:
            if not self.pending:
                break
            if node in self.running.values():
                raise ValueError(f"node {node} already runs a shard")
            shard = self.pending.pop(0)
            self.running[shard] = node
            self.history.append((shard, node, "start"))
            out.append((shard, node))
        return out

    def finish(self, shard: int, node: N, result: R) -> bool:
        """`node`'s result for `shard`; False (dropped) where `node` does not hold it now."""
        if self.running.get(shard) != node:
            self.history.append((shard, node, "dropped"))
            return False
        del self.running[shard]
        self.done[shard] = result
        self.history.append((shard, node, "done"))
        return True

    def lost(self, node: N) -> list[int]:
        """`node` is gone: its shard goes back to the front of the queue, to be re-run whole."""
        back = [s for s, n in self.running.items() if n == node]
        for shard in back:
            del self.running[shard]
            self.history.append((shard, node, "lost"))
        self.pending[:0] = sorted(back)
        return back

    def results(self) -> list[R]:
        """Every shard's result, by shard (once complete)."""
        if not self.complete:
            raise ValueError(f"shards {sorted(set(range(self.count)) - set(self.done))} "
                             "are not done")
        return [self.done[i] for i in range(self.count)]
