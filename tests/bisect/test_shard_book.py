"""Which node runs which shard of a sharded probe (bisect/cluster/shard_book.py): every shard done
exactly once, a lost node's shard re-run whole elsewhere, a late answer from a lost node dropped."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4bisect.bisect.cluster.shard_book import ShardBook


def test_a_lost_node_gives_its_shard_to_the_next_free_node() -> None:
    book: ShardBook[str, str] = ShardBook(3)
    assert book.deal(["a", "b"]) == [(0, "a"), (1, "b")]
    assert book.lost("a") == [0]
    assert book.finish(1, "b", "r1")
    assert book.deal(["b"]) == [(0, "b")]  # the lost shard first, before shard 2
    assert not book.finish(0, "a", "late")  # the lost node's late answer: dropped
    assert book.finish(0, "b", "r0")
    assert book.deal(["b"]) == [(2, "b")] and book.finish(2, "b", "r2")
    assert book.complete and book.results() == ["r0", "r1", "r2"]
    assert [e for e in book.history if e[2] in ("lost", "dropped")] == [
        (0, "a", "lost"), (0, "a", "dropped")]


def test_a_node_holds_one_shard_at_a_time_and_results_wait_for_every_shard() -> None:
    book: ShardBook[str, str] = ShardBook(2)
    book.deal(["a"])
    with pytest.raises(ValueError, match="already runs"):
        book.deal(["a"])
    with pytest.raises(ValueError, match="not done"):
        book.results()
    with pytest.raises(ValueError):
        ShardBook(0)


events = st.lists(st.tuples(st.sampled_from(["finish", "lose", "late"]), st.integers(0, 3)),
                  max_size=60)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), events)
def test_every_shard_is_done_once_whatever_is_lost(count, nodes, script) -> None:
    """Random finishes, losses (a lost node comes back as a new one) and late answers of lost
    nodes: when the book is complete every shard has exactly one accepted result, from the
    node that held it last."""
    book: ShardBook[tuple[int, int], tuple[int, tuple[int, int]]] = ShardBook(count)
    generation = [0] * nodes
    free = [(n, 0) for n in range(nodes)]
    gone: list[tuple[int, tuple[int, int]]] = []  # (shard, node) in flight when lost
    accepted = []

    def step(kind: str, pick: int) -> None:
        for shard, node in book.deal(list(free)):
            free.remove(node)
        if kind == "late" and gone:
            shard, node = gone.pop(pick % len(gone))
            assert not book.finish(shard, node, (shard, node))
            return
        if not book.running:
            return
        shard, node = sorted(book.running.items())[pick % len(book.running)]
        if kind == "finish":
            assert book.finish(shard, node, (shard, node))
            accepted.append(shard)
            free.append(node)
        else:
            assert book.lost(node) == [shard]
            gone.append((shard, node))
            generation[node[0]] += 1
            free.append((node[0], generation[node[0]]))

    for kind, pick in script:
        step(kind, pick)
    while not book.complete:
        step("finish", 0)
    assert sorted(accepted) == list(range(count))
    assert [r[0] for r in book.results()] == list(range(count))
    for shard, node in gone:
        assert not book.finish(shard, node, (shard, node))
