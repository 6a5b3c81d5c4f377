"""Output directories are never shared (issue 30, item 4): two probes started in the same second
with the default `--out` used to write into one `runs/probe-%Y%m%d-%H%M%S`."""

from __future__ import annotations

import threading
from pathlib import Path

from dsv4bisect.engines.rundir import new_run_dir
from dsv4bisect.base.unique_dir import make_unique_dir
from tests.hardening.cli_inproc import cli


def _race(make: object, n: int = 16) -> list[Path]:
    out: list[Path] = []
    barrier = threading.Barrier(n)

    def one() -> None:
        barrier.wait()
        out.append(make())  # type: ignore[operator]

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_probe_dirs_started_together_are_distinct(tmp_path: Path) -> None:
    dirs = _race(lambda: make_unique_dir(tmp_path / "runs", "probe"))
    assert len(set(dirs)) == 16 and all(d.is_dir() for d in dirs)
    assert all(d.name.startswith("probe-") and d.name.endswith(tuple("0123456789abcdef"))
               for d in dirs)


def test_run_dirs_of_one_profile_started_together_are_distinct(tmp_path: Path) -> None:
    dirs = _race(lambda: new_run_dir(tmp_path, "reference", "0123456789abcdef"))
    assert len(set(dirs)) == 16 and all(d.is_dir() for d in dirs)


def test_two_probes_with_the_default_out_write_to_two_directories(tmp_path: Path,
                                                                   monkeypatch: object) -> None:
    # The real CLI, twice in the same second; the servers are unreachable (exit 125), which
    # happens after the output directory is made.
    monkeypatch.chdir(tmp_path)  # type: ignore[attr-defined]
    for _ in range(2):
        res = cli("probe", "http://127.0.0.1:9", "--baseline", "http://127.0.0.1:9",
                  "--tier", "ci")
        res.assert_clean()
        assert res.code == 125
    made = sorted((tmp_path / "runs").iterdir())
    assert len(made) == 2 and all(p.name.startswith("probe-") for p in made)
