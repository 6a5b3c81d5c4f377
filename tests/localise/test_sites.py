"""Sites, rows by position and the divergence of two runs (localise/sites.py)."""

from __future__ import annotations

import numpy as np

from dsv4bisect.localise.sites import Capture, Site, SiteRows, compare_site, divergence, layer_of


def test_float_rows_diverge_by_their_relative_l2() -> None:
    ref = np.array([[3.0, 4.0], [1.0, 0.0]], dtype=np.float32)
    other = np.array([[3.0, 4.5], [1.0, 0.0]], dtype=np.float32)
    assert np.allclose(divergence(ref, other), [0.1, 0.0])


def test_ids_are_compared_as_sets() -> None:
    """An indexer's or router's picks in another order are the same picks."""
    ref = np.array([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    other = np.array([[3, 1, 2], [1, 2, 4], [2, 3, 4]])
    assert np.allclose(divergence(ref, other), [0.0, 1 / 3, 1 / 3])  # one pick of three


def test_non_finite_entries_equal_on_both_sides_are_equal() -> None:
    inf = -np.inf
    ref = np.array([[1.0, inf], [1.0, inf]], dtype=np.float32)
    other = np.array([[1.0, inf], [1.0, 2.0]], dtype=np.float32)
    d = divergence(ref, other)
    assert d[0] == 0.0 and d[1] >= 1.0


def test_runs_chunked_differently_are_compared_position_by_position() -> None:
    def cap(chunks: list[tuple[int, int]]) -> Capture:
        c = Capture()
        c.sites["m:op:0"] = Site("m:op:0", "m", "op", "0", 0)
        c.rows["m:op:0"] = SiteRows()
        data = np.arange(40, dtype=np.float32).reshape(20, 2)
        for a, b in chunks:
            c.rows["m:op:0"].add(0, np.arange(a, b), data[a:b])
        return c

    got = compare_site(cap([(0, 20)]), cap([(10, 20), (0, 10)]), "m:op:0")
    assert got is not None and list(got.positions) == list(range(20))
    assert not got.d.any()


def test_a_position_recorded_twice_keeps_its_last_rows() -> None:
    rows = SiteRows()
    rows.add(0, np.array([0, 1]), np.array([[1.0], [2.0]], dtype=np.float32))
    rows.add(0, np.array([1]), np.array([[5.0]], dtype=np.float32))
    pos, r = rows.by_seq()[0]
    assert list(pos) == [0, 1] and r[:, 0].tolist() == [1.0, 5.0]


def test_layer_of_reads_layers_n() -> None:
    assert layer_of("layers.3.attn.compressor") == 3
    assert layer_of("model.layers.12") == 12
    assert layer_of("head") is None
