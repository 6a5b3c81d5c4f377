"""Which node ran a trial, and when, in a bisect's report (bisect/report.py): `--executor ray`
trials carry `details.node`; trials on this machine show nothing."""

from __future__ import annotations

from dsv4bisect.bisect import report


def test_a_node_trial_says_where_and_when() -> None:
    details = {"node": {"name": "gpu-3 (10.0.0.13, node 4f2a91c0)", "node_id": "4f2a91c0aa",
                        "started": 3600.0, "finished": 3600.0 + 95.5}}
    assert report._node(details) == details["node"]
    assert report._where(details) == ("; on gpu-3 (10.0.0.13, node 4f2a91c0), "
                                       "01:00:00-01:01:35 UTC")


def test_a_sharded_trial_names_the_nodes_its_probe_ran_on() -> None:
    details = {"node": {"name": "a", "started": 0.0, "finished": 60.0,
                        "replicas": [{"name": "b", "started": 10.0, "finished": 60.0}]}}
    assert report._where(details) == ("; on a, 00:00:00-00:01:00 UTC, probe sharded + b "
                                       "(00:00:10-00:01:00)")


def test_a_local_trial_says_nothing() -> None:
    assert report._node({}) is None and report._where({"mode": "hot"}) == ""
    assert report._where({"node": {"name": "n"}}) == "; on n, ?-? UTC"


def test_a_bad_end_started_ahead_says_so() -> None:
    details = {"node": {"name": "b", "started": 0, "finished": 90,
                        "ahead": {"started": 0, "finished": 30, "rows": 4, "resumed": 80}}}
    assert report._where(details) == ("; on b, 00:00:00-00:01:30 UTC, started ahead of the "
                                      "good end (4 rows 00:00:00-00:00:30, finished with its "
                                      "run from 00:01:20)")
