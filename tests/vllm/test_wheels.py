"""Slow: every shipped vLLM fact comes from the release's own wheel. Downloads the five wheels
(`pip download --no-deps`, ~1.3 GB, into ~/.cache/dsv4bisect/vllm-wheels:
tests/vllm/vllm_wheels.py), regenerates the source facts and the switch catalogs by AST and
requires them equal to the shipped files; runs doctor against each wheel, and the GPU check's
CPU arm from slices of the wheels (vLLM's own mhc torch.py and routing fallbacks against the
hooks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4bisect.base.vllm_releases import VERIFIED, load_facts
from dsv4bisect.patching.switch_catalog import dumps as dump_catalog
from dsv4bisect.patching.switch_catalog import load_catalog
from dsv4bisect.plugin.vllm.discover import discover
from dsv4bisect.plugin.vllm.facts import extract
from dsv4bisect.plugin.vllm.tree import open_tree

sys.path.insert(0, str(Path(__file__).parent))
from vllm_wheels import READ, fetch_all, wheel_of  # noqa: E402

ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _every_wheel() -> None:
    """Every test here reads the wheels: download the missing ones at once, in parallel."""
    fetch_all()


@pytest.mark.parametrize("release", VERIFIED)
def test_the_shipped_facts_and_catalog_are_the_wheels(release: str) -> None:
    tree = open_tree(wheel_of(release))
    assert tree.version() == release
    facts = extract(tree)
    assert facts == load_facts(release), "regenerate: python tests/benchmarks/gen_vllm_facts.py"
    catalog = discover(tree, release)
    assert dump_catalog(catalog) == dump_catalog(load_catalog(release, "vllm"))


@pytest.mark.parametrize("release", VERIFIED)
def test_doctor_reads_the_wheel(release: str, cli) -> None:
    got = cli("doctor", "dsv4-flash-vllm-tp8-latest-all", "--set",
              f"engine.vllm_version={release}", "--vllm-src", wheel_of(release), "--json")
    rows = {r["name"]: r for r in json.loads(got.stdout)}
    assert rows["vLLM"]["status"] == "ok" and release in rows["vLLM"]["detail"]
    assert rows["vllm serve argv"]["status"] == "ok"
    hooks = [r for n, r in rows.items() if ":" in n and not n.startswith("preflight")]
    assert hooks and all(r["status"] == "ok" for r in hooks), hooks
    assert all("AST of vllm-" in r["detail"] for r in hooks if "call " not in r["name"])


def test_a_relabelled_release_is_refused_and_accepted_under_the_opt_in(tmp_path: Path,
                                                                       cli) -> None:
    import shutil
    import zipfile

    src = tmp_path / "vllm-src"
    with zipfile.ZipFile(wheel_of(VERIFIED[-1])) as z:
        z.extractall(src, [n for n in z.namelist() if n.endswith(".py")])
    (src / "vllm" / "_version.py").write_text("__version__ = version = '0.99.0'\n")
    got = cli("doctor", "dsv4-flash-vllm-tp8-latest-all", "--vllm-src", src)
    assert got.returncode == 1
    assert "error: vLLM 0.99.0 is not a verified release" in got.stderr
    got = cli("doctor", "dsv4-flash-vllm-tp8-latest-all", "--vllm-src", src,
              "--allow-unverified-vllm", "--json")
    vllm_row = next(r for r in json.loads(got.stdout) if r["name"] == "vLLM")
    assert vllm_row["status"] == "warn" and "0.34.0 hook layout" in vllm_row["detail"]
    shutil.rmtree(src)


def test_the_gpu_checks_cpu_arm_on_slices_of_the_wheels(tmp_path: Path) -> None:
    slices = tmp_path / "slices"
    script = ROOT / "tests" / "vllm" / "gpu_vllm_check.py"
    made = subprocess.run([sys.executable, script, "--make-slices", slices],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    got = subprocess.run([sys.executable, script, "--slices", slices, "--device", "cpu",
                          "--smoke", "--out", tmp_path], capture_output=True, text=True,
                         timeout=900)
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-2000:]
    rows = json.loads((tmp_path / "vllm_hooks.json").read_text())["rows"]
    assert all(r["ok"] for r in rows) and len(rows) >= 40


def teardown_module() -> None:
    print(f"\nvllm wheels read: {len(READ)} of {len(VERIFIED)} verified releases "
          f"({', '.join(sorted(READ))})")
