"""The layering of docs/architecture.md, enforced: the import-linter contract in pyproject.toml
(no ignored edge), a check of the folders mapped into the package that import-linter cannot see
(kernels/, patches/, profiles/), and the module map checked against the tree."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dsv4bisect"
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
LAYERS = [re.split(r"\s*[:|]\s*", layer) for layer in CONFIG["contracts"][0]["layers"]]


def _rank(module: str) -> int | None:
    """The layer index (0 = highest) of a dsv4bisect module, by its top-level package."""
    parts = module.split(".")
    if parts[0] != "dsv4bisect" or len(parts) < 2:
        return None
    return next((i for i, layer in enumerate(LAYERS) if parts[1] in layer), None)


def _imports(path: Path) -> set[str]:
    """Every dsv4bisect module a file imports, at any depth (a lazy import counts too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m == "dsv4bisect" or m.startswith("dsv4bisect.")}


def test_the_layers_contract_holds_with_no_ignored_edge(capsys):
    from importlinter.application.use_cases import lint_imports
    from importlinter.configuration import configure

    configure()

    for contract in CONFIG["contracts"]:
        assert "ignore_imports" not in contract and "unmatched_ignore_imports_alerting" \
            not in contract, contract["id"]
    kept = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_logo=True)
    assert kept, capsys.readouterr().out[-4000:]


def test_every_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
                and not p.is_symlink()}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "__main__"}
    placed = {name for layer in LAYERS for name in layer}
    assert packages | modules <= placed, sorted((packages | modules) - placed)


# The folders mapped into the package at install time (pyproject's package-dir): import-linter
# reads the package's own folder, where they are not. The patch layer sits between the registry
# that loads it (`patching`) and the code its declarations point to (the hook bodies of each
# engine kind, `sglang_hooks : vllm_hooks`, and below).
BELOW_PATCHES = _rank("dsv4bisect.sglang_hooks")
assert BELOW_PATCHES == _rank("dsv4bisect.patching") + 1, "the patch layer's place moved"
assert _rank("dsv4bisect.vllm_hooks") == BELOW_PATCHES, "the hook bodies share one layer"


@pytest.mark.parametrize("path", sorted((ROOT / "kernels").glob("*.py")), ids=lambda p: p.name)
def test_a_kernel_imports_only_kernels(path):
    # One file per op, its PyTorch reference beside it: a kernel is the bottom of the stack.
    assert all(m.startswith("dsv4bisect.kernels") for m in _imports(path)), _imports(path)


@pytest.mark.parametrize("path", sorted((ROOT / "patches").glob("*.py")), ids=lambda p: p.name)
def test_a_patch_imports_only_its_layer_and_below(path):
    # A patch is one unit of the patch layer: its declaration (patchspec), the code it points
    # to (its SGLang hook bodies, kernels, its own embedded swaps), release data; never the
    # registry that loads it, the engines, the plugin that installs it or the CLI.
    above = [m for m in _imports(path) if not m.startswith(("dsv4bisect.patches",
                                                             "dsv4bisect.kernels"))
             and (_rank(m) is None or _rank(m) < BELOW_PATCHES)]
    assert not above, above


def test_profiles_are_data():
    assert [p.name for p in (ROOT / "profiles").glob("*.py")] == ["__init__.py"]
    assert not _imports(ROOT / "profiles" / "__init__.py")


def test_nothing_below_the_patch_layer_imports_the_patches_or_profiles():
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if (PACKAGE / rel.parts[0]).is_symlink():
            continue  # kernels/, patches/, profiles/ in a checkout that links them
        module = "dsv4bisect." + ".".join(rel.with_suffix("").parts)
        rank = _rank(module)
        if rank is None or rank < BELOW_PATCHES:
            continue
        wrong += [f"{module} -> {m}" for m in _imports(path)
                  if m.startswith(("dsv4bisect.patches", "dsv4bisect.profiles"))]
    assert not wrong, wrong


def _map() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    return text.split("## Layers and the dependency rule", 1)[1].split("```")[1]


def test_the_module_map_lists_the_layers_in_the_contracts_order():
    rows = [line.split()[0] for line in _map().splitlines()
            if line and not line.startswith((" ", "-"))]
    named = [r.rstrip("/").removesuffix(".py") for r in rows]
    order = [name for layer in LAYERS for name in layer]
    on_map = [n for n in named if n in order]
    assert on_map == [n for n in order if n in on_map], on_map
    # every package and top-level module has its row; kernels/ and patches/ are on the map too
    assert set(order) <= set(named), sorted(set(order) - set(named))


def test_every_file_and_folder_the_map_names_exists():
    text = _map()
    rows, package = [], None
    for line in text.splitlines():
        if line and not line.startswith((" ", "-")):
            package = line.split()[0].rstrip("/")
        for name in re.findall(r"[\w/]+\.py|(?<![\w/])(?:[a-z_]+/)+(?=[\s),]|$)", line):
            rows.append((package, name))
    missing = []
    for package, name in rows:
        candidates = [ROOT / name, PACKAGE / name, ROOT / "dsv4bisect" / package / name,
                      *(d / name for d in (PACKAGE / package).rglob("*") if d.is_dir())]
        candidates += [ROOT / package / name]
        if not any(c.exists() for c in candidates):
            missing.append(f"{package}: {name}")
    assert not missing, missing


def test_every_bisect_subpackage_is_on_the_map():
    text = _map()
    subs = [p.name for p in (PACKAGE / "bisect").iterdir() if (p / "__init__.py").exists()]
    assert all(f"{s}/" in text for s in subs), subs


def _map_blocks() -> dict[str, str]:
    """Each row of the map with its continuation lines, by the row's package or module."""
    blocks: dict[str, str] = {}
    row = None
    for line in _map().splitlines():
        if line and not line.startswith((" ", "-")):
            row = line.split()[0].rstrip("/").removesuffix(".py")
            blocks[row] = ""
        if row is not None:
            blocks[row] += line + "\n"
    return blocks


def _product_files() -> list[tuple[str, Path]]:
    """Every product file with the map row it belongs on: a package's files (its subpackages'
    too) on the package's row, a top-level module on its own, patches/ and kernels/ on theirs."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if (PACKAGE / rel.parts[0]).is_symlink() or path.name == "__init__.py":
            continue  # a checkout that links kernels/, patches/ (their own rows, below)
        out.append((rel.parts[0].removesuffix(".py"), path))
    for folder in ("patches", "kernels"):
        out += [(folder, p) for p in sorted((ROOT / folder).glob("*.py"))
                if p.name != "__init__.py"]
    return out


def test_every_product_file_is_on_the_map():
    # the other way round from test_every_file_and_folder_the_map_names_exists: a file
    # nobody put on the map is a module a newcomer cannot find
    blocks = _map_blocks()
    missing = [str(p.relative_to(ROOT)) for row, p in _product_files()
               if row not in blocks or (row != p.stem and not re.search(
                   rf"(?<![\w/]){re.escape(p.name)}", blocks[row]))]
    assert not missing, missing


BISECT = CONFIG["contracts"][1]


def test_every_bisect_module_has_a_layer_inside_the_bisect():
    assert BISECT["containers"] == ["dsv4bisect.bisect"]
    placed = {name for layer in BISECT["layers"] for name in re.split(r"\s*[:|]\s*", layer)}
    here = {p.stem for p in (PACKAGE / "bisect").glob("*.py")} - {"__init__"}
    here |= {p.name for p in (PACKAGE / "bisect").iterdir() if (p / "__init__.py").exists()}
    assert here == placed, (sorted(here - placed), sorted(placed - here))


# torch, triton and sglang: where docs/architecture.md says they are imported
HEAVY = ("torch", "triton", "sglang")
HEAVY_PACKAGES = ("reference", "kernels", "microtest", "localise", "plugin", "sglang_hooks",
                  "vllm_hooks")
HEAVY_LAZILY = ("cli/bisect_priors.py",)  # inside a function: the device of the microtest
HEAVY_LAZILY_ROWS = ("patches",)  # a patch's swap bodies: loading the registry imports none


def _heavy(nodes: list[ast.stmt]) -> set[str]:
    found = set()
    for node in ast.walk(ast.Module(body=nodes, type_ignores=[])):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found & set(HEAVY)


def _run_on_import(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements importing the module runs: not a function's (a class's methods
    included), not an `if TYPE_CHECKING:` block (annotations only)."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
                isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
            continue
        if isinstance(node, ast.ClassDef):
            out += _run_on_import(node.body)
        else:
            out.append(node)
    return out


def test_torch_triton_and_sglang_are_imported_only_where_the_map_says():
    wrong = []
    for row, path in _product_files():
        if row in HEAVY_PACKAGES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef,
                                                             ast.AsyncFunctionDef))]
        top = _run_on_import(tree.body)
        rel = str(path.relative_to(PACKAGE if path.is_relative_to(PACKAGE) else ROOT))
        lazily = rel in HEAVY_LAZILY or row in HEAVY_LAZILY_ROWS
        if _heavy(top) or (_heavy(funcs) and not lazily):
            wrong.append(rel)
    assert not wrong, wrong
