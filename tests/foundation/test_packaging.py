"""Packaging: every package directory is installed; patches/kernels/profiles live under
dsv4bisect, never as top-level `kernels` (a PyPI package of that name exists)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _setuptools() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _declared_packages() -> dict[str, str]:
    setuptools = _setuptools()
    return {"packages": setuptools["packages"], "dirs": setuptools["package-dir"]}


def test_every_package_directory_is_declared() -> None:
    declared = _declared_packages()
    found = {"dsv4bisect." + ".".join(p.parent.relative_to(ROOT / "dsv4bisect").parts)
             for p in (ROOT / "dsv4bisect").rglob("__init__.py")}
    found = {f.rstrip(".") for f in found} | {"dsv4bisect"}
    found.discard("dsv4bisect.")
    assert found <= set(declared["packages"]), found - set(declared["packages"])
    for top in ("patches", "kernels", "profiles"):
        assert declared["dirs"][f"dsv4bisect.{top}"] == top


def test_no_top_level_kernels_package_is_importable_from_the_install() -> None:
    import dsv4bisect.kernels

    assert Path(dsv4bisect.kernels.__file__).parent == ROOT / "kernels"
    assert "kernels" not in _declared_packages()["packages"]


def test_the_switch_catalogs_ship_as_package_data() -> None:
    """`load_catalog` reads them from the installed package: pyproject must include them."""
    import fnmatch

    patterns = _setuptools()["package-data"]["dsv4bisect.patching"]
    shipped = sorted((ROOT / "dsv4bisect" / "patching" / "switch_data").glob("*.json"))
    assert shipped
    for path in shipped:
        rel = path.relative_to(ROOT / "dsv4bisect" / "patching").as_posix()
        assert any(fnmatch.fnmatch(rel, p) for p in patterns), rel
