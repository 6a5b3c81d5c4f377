"""Issue 31, item 6: installs and tests state their cost. The CPU install (`[engine]`) does not
pull Triton (the `kernels` extra does), nothing on the CPU path imports it, and the README says
what the test suite downloads and how long it took."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4bisect.base.versions import VERIFIED

ROOT = Path(__file__).parents[2]


def extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data["project"]["optional-dependencies"]


def test_the_engine_extra_has_no_triton_and_the_kernels_extra_does() -> None:
    found = extras()
    assert not any(d.startswith("triton") for d in found["engine"]), found["engine"]
    assert "dsv4bisect[engine]" in found["kernels"]
    assert any(d.startswith("triton") for d in found["kernels"])


def test_the_cpu_path_runs_with_triton_unimportable(tmp_path: Path) -> None:
    """The embedded checkpoint loads and the microtest runs with `import triton` failing."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "from dsv4bisect.config.checkpoints import checkpoint_dir\n"
        "from dsv4bisect.reference.checkpoint import load_model\n"
        "load_model(checkpoint_dir('embedded'))\n"
        "from dsv4bisect.cli import main\n"
        f"main(['microtest', 'mhc-bf16', 'nvfp4-dispatch', '--layers', '0', '--out', "
        f"{str(tmp_path)!r}])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "PASS: 0 of" in r.stderr


def fast_releases() -> tuple[str, ...]:
    """The SGLang releases whose wheels the fast suite reads (tests/sglang/wheels.py)."""
    sys.path.insert(0, str(ROOT / "tests" / "sglang"))
    try:
        from wheels import FAST_VERSIONS
    finally:
        sys.path.pop(0)
    assert set(FAST_VERSIONS) < set(VERIFIED)
    return FAST_VERSIONS


def test_the_readme_states_the_installs_and_the_suites_cost() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "pip install torch==2.13.0 -e '.[kernels,test,plots]'" in readme
    assert "pip install -q torch==2.13.0 -e '.[kernels,test,plots]'" in (
        ROOT / ".ci" / "run").read_text()  # CI runs exactly the README's command
    wheels = re.search(r"\((\d+) wheels, (\d+) MB", readme)
    assert wheels and int(wheels.group(1)) == len(fast_releases())  # the fast suite's
    assert re.search(r"took about \d+ minutes on the shared\s+2-core CPU machine", readme)
    assert "It does not install Triton" in readme
