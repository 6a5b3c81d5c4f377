"""A run's computed prompt tokens from its rows (probe/computed.py): what the server said it
found cached where it says so, the arm's model where it does not."""

from dsv4bisect.probe.computed import request_computed, row_computed, run_computed


def test_rows_count_what_their_server_found_cached_and_the_model_the_rest():
    rows = [
        {"arm": "cold", "prompt_tokens": 1000, "cached_tokens": 16},  # a shared template head
        {"arm": "hit", "prompt_tokens": 1000, "cached_tokens": 999},  # SGLang: 1 token a send
        {"arm": "warm", "prompt_tokens": 1000, "cached_tokens": 960},  # the replay did the rest
        {"arm": "cold", "prompt_tokens": 500, "cached_tokens": None},  # not reported: the model
        {"arm": "drift", "prompt_tokens": 300},
    ]
    assert [row_computed(r) for r in rows] == [984, 2, 1000, 500, 300]
    assert run_computed(rows) == 2786
    assert request_computed("hit", 1000) == 2  # after its cold request: both sends hit
    assert request_computed("hit", 1000, after_cold=False) == 1001
    assert request_computed("hit", 1000, recomputed=0) == 0  # the embedded engine
