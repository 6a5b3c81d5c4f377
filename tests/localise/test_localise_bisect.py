"""`localise BISECT_DIR`: the bisect's bad end, its culprit and the cases that lost facts.

Fast: a real bisect's directory kept as test data (tests/localise/data/bisect-scale-layout,
its README says how it was made and what was trimmed) is read back. Slow: it is localised, and
one real bisect is run end to end and localised (~20 min on the loaded 2-core CPU).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.localise.test_localise_cli import FAULTS

DATA = Path(__file__).parent / "data" / "bisect-scale-layout"


@pytest.fixture
def bisect_dir(tmp_path: Path) -> Path:
    """The kept bisect, copied (nothing is written to the test data)."""
    shutil.copytree(DATA, tmp_path / "runs")
    return next(p for p in (tmp_path / "runs").iterdir() if (p / "bisect.json").is_file())


def test_a_bisect_directory_gives_its_ends_culprit_and_lost_cases(bisect_dir: Path) -> None:
    from dsv4bisect.bisect.localise_input import read_bisect
    from dsv4bisect.localise.driver import Question, pick_cases, resolve_ends

    got = read_bisect(bisect_dir)
    assert got.culprit == ("fp8-wo-a-gemm",) and got.profile == "reference-all"
    assert got.bad_patches["fp8-wo-a-gemm"] == "scale-layout"
    q = Question(bisect=got, cases=3)
    ends = resolve_ends(q)
    assert ends.good.patch_set == {**ends.bad.patch_set, "fp8-wo-a-gemm": "fp8"}
    cases, notes = pick_cases(q, lambda _: None)
    assert len(cases) == 3 and not notes
    assert all(c.why.startswith("lost: ") and c.answer for c in cases)
    assert [len(c.ids) for c in cases] == sorted((len(c.ids) for c in cases), reverse=True)


def test_a_bisect_that_found_nothing_has_nothing_to_localise(bisect_dir: Path, cli) -> None:
    import sqlite3

    ledger = bisect_dir.parent / "ledger.sqlite"
    with sqlite3.connect(ledger) as conn:
        conn.execute("UPDATE runs SET result = ?", (json.dumps({"status": "budget"}),))
    proc = cli("localise", bisect_dir)
    assert proc.returncode == 5 and "named no culprit" in proc.stderr


def test_the_localise_command_a_bisect_prints() -> None:
    from dsv4bisect.localise.command import bisect_command, profile_command, shell

    assert bisect_command("runs/x") == ["dsv4bisect", "localise", "runs/x"]
    assert shell(profile_command("reference", only=("mma-decode",),
                                 sets=("patches.mma-decode.variant=merge-no-rescale",))) == (
        "dsv4bisect localise reference --only mma-decode "
        "--set patches.mma-decode.variant=merge-no-rescale")


@pytest.mark.slow
@pytest.mark.e2e
def test_the_kept_bisect_localises_to_wo_a(bisect_dir: Path, cli, tmp_path: Path) -> None:
    proc = cli("localise", bisect_dir, "--json", "--out", tmp_path / "out", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    first = out["first_divergence"]
    assert (first["module"], first["op"]) == ("layers.0.attn", "attn.wo_a")
    assert out["cases"][0]["why"].startswith("lost: ")
    assert out["bisect_dir"] == str(bisect_dir.resolve())


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize(("patch", "variant", "module", "op", "kind"), FAULTS,
                         ids=[f[1] for f in FAULTS])
def test_a_real_bisect_then_localise(cli, tmp_path: Path, patch: str, variant: str,
                                     module: str, op: str, kind: str) -> None:
    """Each fault that FAILs in the verdict table, bisected by default (`reference-all` with the
    fault's variant), then `localise BISECT_DIR`: the same op as `localise reference --only`
    names (test_localise_cli.py), from the bisect's own ends, culprit and lost cases."""
    proc = cli("bisect", "reference-all", "--set", f"patches.{patch}.variant={variant}",
               "--out", tmp_path, "--json", timeout=5400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout)
    assert patch in found["culprits"], found["culprits"]
    proc = cli("localise", found["run_dir"], "--json", "--out", tmp_path / "out", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = json.loads(proc.stdout)["first_divergence"]
    assert (first["module"], first["op"], first["kind"]) == (module, op, kind)


def test_a_found_bisect_gives_the_localise_command_and_others_none(bisect_dir: Path,
                                                                    tmp_path: Path) -> None:
    import sqlite3

    from dsv4bisect.bisect.localise_input import localise_command

    assert localise_command(bisect_dir) == f"dsv4bisect localise {bisect_dir}"
    spaced = tmp_path / "my runs"
    shutil.copytree(bisect_dir.parent, spaced)
    moved = spaced / bisect_dir.name
    assert localise_command(moved) == f"dsv4bisect localise '{moved}'"  # a shell takes it back
    assert localise_command(tmp_path / "nowhere") is None
    info = json.loads((moved / "bisect.json").read_text())
    (moved / "bisect.json").write_text(json.dumps(
        {**info, "request": {**info["request"], "profile": "reference-pd"}}))
    assert localise_command(moved) is None  # a PD profile: localise refuses it
    with sqlite3.connect(bisect_dir.parent / "ledger.sqlite") as conn:
        conn.execute("UPDATE runs SET result = ?", (json.dumps({"status": "budget"}),))
    assert localise_command(bisect_dir) is None  # no FOUND culprit
