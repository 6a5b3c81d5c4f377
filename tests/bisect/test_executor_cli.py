"""`bisect --executor ray` where Ray cannot be imported (as in CI, which does not install the
extra): one `error:` line with the install hint, exit 5, and no ledger or run directory; and
its `--plan`, which needs no Ray, with the node table. The import is blocked in the real CLI
process (`sys.modules["ray"] = None`), so this holds on a machine that has Ray too."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

NO_RAY = ("import runpy, sys; sys.modules['ray'] = None; "
          "runpy.run_module('dsv4bisect', run_name='__main__')")


def test_executor_ray_without_ray_is_one_error_line_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", NO_RAY, "bisect", "--tier", "ci", "--executor",
                        "ray", "--out", str(out)], capture_output=True, text=True,
                       env={**os.environ, "NO_COLOR": "1"}, timeout=300, check=False)
    assert r.returncode == 5, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:"))]
    assert lines[0].startswith("error: --executor ray needs Ray, which is not installed")
    assert lines[1] == "hint: pip install 'dsv4bisect[ray]' (on the driver and on every node)"
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not out.exists() or not any(out.iterdir()), "the bisect wrote something"


def test_only_the_ray_executor_imports_ray() -> None:
    # the executor and its pool of node slots; both imported only when `ray` is chosen
    package = Path(__file__).parents[2] / "dsv4bisect"
    importers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                       if any(line.lstrip().startswith(("import ray", "from ray"))
                              for line in p.read_text().splitlines()))
    assert importers == ["bisect/cluster/ray_executor.py", "bisect/cluster/slots.py"]
    code = ("import sys, dsv4bisect.bisect.cluster.executors; from dsv4bisect.cli import app; "
            "import dsv4bisect.bisect.cluster.remote_trial, dsv4bisect.engines.reaper; "
            "print([m for m in ('ray', 'torch') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow  # plans of the standard tier: ~1 min of simulation on 2 cores (issue 42's 400 runs)
def test_plan_for_ray_nodes_prints_the_node_table_without_ray(cli, tmp_path: Path) -> None:
    """`--plan --executor ray --parallel 3` needs no Ray: the single-node plan as without the
    executor, then rows for 1, 2, 3 and 4 nodes, with and without the levers, each with and
    without sharded probes, the floor, and the costs they are priced with."""
    plan = ("bisect", "dsv4-flash-tp8-all", "--plan", "--executor", "ray", "--parallel", "3")
    text = cli(*plan, cwd=tmp_path, python=("-c", NO_RAY))
    assert text.returncode == 0, text.stderr
    lines = text.stderr.splitlines()
    head = lines.index(next(x for x in lines if x.startswith("on Ray nodes (--executor ray")))
    assert lines[head].endswith("outcome streams in every row):")  # as many runs as above
    assert lines[head + 1].split() == ["nodes", "levers", "sharded", "wall", "p90", "rounds",
                                       "trials", "launches", "idle", "slots", "idle", "time",
                                       "P(correct)"]
    rows = [x.split() for x in lines[head + 2:head + 18]]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (k, on, sharded) for k in "1234" for on in ("with", "without") for sharded in ("no", "yes")]
    assert [r[-1] for r in rows if r[-1] == "--parallel" and r[0] == "3"] == ["--parallel"] * 4
    assert any("idle slots: node-rounds with no trial" in x for x in lines[head + 18:])
    assert any(x.startswith("  floor (what a bisect told the culprits must still run")
               for x in lines[head + 18:])
    assert lines[-1].startswith("(simulated 400 bisects per configuration")
    # the ends shared between nodes (docs/cluster.md): more nodes are faster, with the levers
    # too, and the plan says by how much against one node
    assert any(re.match(r"  sharding (saves|costs) ", x)
               and "with the levers and sharding, 2, 3 and 4 nodes take " in x for x in
               lines[head + 18:])

    ray = json.loads(cli(*plan, "--json", cwd=tmp_path, python=("-c", NO_RAY)).stdout)
    nodes = ray.pop("nodes")  # beside the single-node plan's keys, which stay as they are
    assert sorted(ray) == ["candidates", "confirm", "costs", "ends_looks", "hot", "levers",
                           "load_time",
                           "mean_launches", "mean_trials", "mean_wall_s", "n_candidates", "noise",
                           "p90_wall_s",
                           "p_correct", "p_correct_low", "phase_s", "runs", "trial_noise",
                           "with_levers",
                           "without_levers"]
    assert nodes["runs"] == 400 and nodes["parallel"] == 3 and nodes["confirmation"] is False
    rows = {(r["nodes"], r["levers"], r["sharded"]): r for r in nodes["rows"]}
    assert sorted(rows) == [(k, on, sharded) for k in (1, 2, 3, 4) for on in (False, True)
                            for sharded in (False, True)]
    assert all(r["wall_s"] == r["mean_wall_s"] and 0 <= r["idle_share"] < 1
               for r in rows.values())
    assert [f["nodes"] for f in nodes["floor"]] == [1, 2, 3, 4]
    assert nodes["costs"] == ray["costs"] and all(c["source"] for c in nodes["costs"])
    got = {(k, on): r for (k, on, sharded), r in rows.items() if not sharded}
    one = got[(1, True)]
    assert one["mean_rounds"] == one["mean_trials"] and one["idle_share"] == 0
    # no confirmation on Ray, in the single-node plan either: 1 node is that plan's figure, on
    # the same 400 runs
    assert ray["confirm"] is False and ray["phase_s"]["confirmation"] == 0
    alone = ray["mean_wall_s"]
    assert abs(one["mean_wall_s"] - alone) < 0.1 * alone
    for k in (2, 3, 4):
        r = got[(k, True)]
        assert r["mean_rounds"] < one["mean_rounds"] < r["mean_trials"]
        assert r["mean_idle_slots"] > 0 and 0 < r["idle_share"] < 1
        assert got[(k, False)]["mean_wall_s"] < got[(1, False)]["mean_wall_s"]
        assert r["mean_wall_s"] < one["mean_wall_s"]  # the line above
        # sharding saves; on two nodes the ends together take a node each, as unsharded, and
        # the two rows tie within a second
        sharded = rows[(k, True, True)]["mean_wall_s"]
        assert sharded < r["mean_wall_s"] if k > 2 else sharded < r["mean_wall_s"] + 1.0
        # how the sharded row runs the ends: the schedule the Ray executor then runs (trials
        # beside the ends need a third node)
        assert rows[(k, True, True)]["ends"] in ("alone", "together", "beside")
        assert k >= 3 or rows[(k, True, True)]["ends"] != "beside"
        assert rows[(k, True, False)]["ends"] is None
    assert not (tmp_path / "runs").exists()


def test_nodes_fewer_than_the_rounds_trials_or_without_ray_is_one_error_line(
        tmp_path: Path) -> None:
    """`--nodes K` is the Ray executor's node slots, at least `--parallel` (the idle ones shard
    probes): refused before anything is written, as bad input (exit 5)."""
    for args, error in ((("--executor", "ray", "--nodes", "1", "--parallel", "2"),
                         "error: --nodes 1 is fewer than --parallel 2 trials a round"),
                        (("--nodes", "2"), "error: --nodes is the Ray executor's")):
        out = tmp_path / "runs"
        r = subprocess.run([sys.executable, "-c", NO_RAY, "bisect", "--tier", "ci", *args,
                            "--out", str(out)], capture_output=True, text=True,
                           env={**os.environ, "NO_COLOR": "1"}, timeout=300, check=False)
        assert r.returncode == 5, r.stderr
        assert any(line.startswith(error) for line in r.stderr.splitlines()), r.stderr
        assert not out.exists() or not any(out.iterdir())
