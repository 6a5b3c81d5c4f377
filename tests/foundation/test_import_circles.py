"""No import circle between product modules: dsv4bisect/, and patches/ and kernels/ as the
`dsv4bisect.patches` and `dsv4bisect.kernels` they install as (which import-linter cannot see).

An edge is any import a module makes, at any depth (a lazy import inside a function, or one
under TYPE_CHECKING, is still a dependency), to the module it names and to every package above
it (importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py`); `importlib.import_module`
of an f-string names every module under its constant prefix (the patch registry's way in)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ((ROOT / "dsv4bisect", "dsv4bisect"), (ROOT / "patches", "dsv4bisect.patches"),
         (ROOT / "kernels", "dsv4bisect.kernels"))
# The patch registry loads every patch: nothing a patch imports may lead back to it (the loop
# patching.registry → a patch → plugin.targets → plugin/__init__ → patching.registry was
# broken by issue 38's fourth part, each patch one unit).
REGISTRY = "dsv4bisect.patching.registry"


def _modules() -> dict[str, Path]:
    out = {}
    for base, prefix in TREES:
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if (base / parts[0]).is_symlink():
                continue  # a checkout that links kernels/, patches/ into the package
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([prefix, *parts])] = path
    return out


def _named(node: ast.AST, module: str, is_package: bool, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
        return [base, *(f"{base}.{a.name}" for a in node.names)]
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" \
            and node.args:
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return [arg.value]
        if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0],
                                                                           ast.Constant):
            return [m for m in known if m.startswith(str(arg.values[0].value))]
    return []


@cache
def _graph() -> dict[str, set[str]]:
    known = _modules()

    def with_packages(name: str) -> set[str]:
        while name and name not in known:  # `from a.b import c`: c may be a name, not a module
            name = name.rpartition(".")[0]
        parts = name.split(".") if name else []
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(known)

    graph = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        deps: set[str] = set()
        for node in ast.walk(tree):
            for name in _named(node, module, path.name == "__init__.py", known):
                deps |= with_packages(name)
        graph[module] = deps - {module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_scan_sees_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_between_product_modules():
    circles = _circles(_graph())
    assert not circles, circles


def test_no_circle_through_the_patch_registry():
    assert not [c for c in _circles(_graph()) if REGISTRY in c]
