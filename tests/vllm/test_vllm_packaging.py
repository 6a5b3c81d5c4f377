"""Packaging of the vLLM kind: the subpackage, its data and the plugin's entry point are
declared (fast), and a wheel built from the checkout installed in a clean venv imports the
vLLM kind and exposes the entry point vLLM loads (slow: builds and installs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_vllm_kind_is_declared_for_installation() -> None:
    data = _pyproject()
    setuptools = data["tool"]["setuptools"]
    assert {"dsv4bisect.plugin.vllm", "dsv4bisect.vllm_hooks"} <= set(setuptools["packages"])
    assert setuptools["package-data"]["dsv4bisect.base"] == ["vllm_data/*.json"]
    assert data["project"]["entry-points"]["vllm.general_plugins"] == {
        "dsv4bisect": "dsv4bisect.plugin.vllm:main"}


CHECK = """
import json, importlib.metadata as m, dsv4bisect
from dsv4bisect.base.vllm_releases import load_facts, shipped_facts
from dsv4bisect.config.resolve import resolve
from dsv4bisect.patching.switch_catalog import load_catalog
from dsv4bisect.plugin.vllm.declared import all_targets
(ep,) = [e for e in m.entry_points(group="vllm.general_plugins") if e.name == "dsv4bisect"]
main = ep.load()
cfg = resolve("dsv4-flash-vllm-tp8-latest-all")
print(json.dumps({"file": dsv4bisect.__file__, "entry": ep.value, "main": main.__module__,
                  "facts": shipped_facts(), "kind": cfg.kind,
                  "settings": len(load_catalog("0.34.0", "vllm").switches),
                  "cli": len(load_facts("0.34.0")["cli"]), "targets": len(all_targets())}))
"""


@pytest.mark.slow
def test_the_wheel_installs_the_vllm_kind_and_its_plugin(tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            tmp_path / "dist", ROOT], capture_output=True, text=True,
                           timeout=900)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("dsv4bisect-*.whl")
    venv = tmp_path / "venv"
    # system site packages for the dependencies (pydantic, typer, ...); the venv's own
    # site-packages come first, so the installed wheel is the dsv4bisect imported
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True,
                   timeout=300)
    py = venv / "bin" / "python"
    done = subprocess.run([py, "-m", "pip", "install", "--no-deps", "-q", wheel],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    got = subprocess.run([py, "-c", CHECK], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert got.returncode == 0, got.stderr[-2000:]
    import json

    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert str(venv) in out["file"]
    assert out["entry"] == "dsv4bisect.plugin.vllm:main" and out["main"] == \
        "dsv4bisect.plugin.vllm"
    assert out["facts"] == ["0.20.0", "0.22.0", "0.24.0", "0.28.0", "0.34.0"]
    assert out["kind"] == "vllm" and out["settings"] >= 30 and out["cli"] > 300
    assert out["targets"] >= 20  # the patches' vLLM deliveries, read from the installed wheel
