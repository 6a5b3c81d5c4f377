"""Static checks of SGLang source by AST: does a hook target exist, with which signature?

Works on a source tree (a directory holding `sglang/`, e.g. a checkout's `python/` folder or an
unpacked wheel) or directly on a wheel file, without importing SGLang (its imports need CUDA
libraries this machine may not have). Used by `dsv4bisect doctor --sglang-src` and the
wheel-based tests. Imports no torch.
"""

from __future__ import annotations

import ast
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # positional | varargs | keyword | varkw
    has_default: bool


@dataclass(frozen=True)
class Resolved:
    """A target found in the source: its kind and (for functions) its parameters."""

    target: str
    kind: str  # function | method | class | assignment
    params: tuple[Param, ...]
    file: str
    line: int
    node: ast.AST

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)


class SourceTree:
    """Python source of a package tree: a directory or a wheel (zip) file."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.exists():
            raise FileNotFoundError(f"{self.root} does not exist")
        self._zip = zipfile.ZipFile(self.root) if self.root.is_file() else None
        self._cache: dict[str, ast.Module | None] = {}

    def __repr__(self) -> str:
        return f"SourceTree({str(self.root)!r})"

    @cached_property
    def _names(self) -> frozenset[str]:
        return frozenset(self._zip.namelist()) if self._zip else frozenset()

    def _read(self, rel: str) -> str | None:
        if self._zip is not None:
            return self._zip.read(rel).decode("utf-8") if rel in self._names else None
        base = self.root / "sglang"
        path = (self.root / rel) if base.is_dir() or not (self.root / "python").is_dir() \
            else self.root / "python" / rel
        return path.read_text(encoding="utf-8") if path.is_file() else None

    def module_file(self, module: str) -> str | None:
        """The relative path holding `module` (a .py file or a package's __init__.py)."""
        rel = module.replace(".", "/")
        for cand in (f"{rel}.py", f"{rel}/__init__.py"):
            if self._read(cand) is not None:
                return cand
        return None

    def source(self, module: str) -> str | None:
        rel = self.module_file(module)
        return None if rel is None else self._read(rel)

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._cache:
            src = self.source(module)
            self._cache[module] = None if src is None else ast.parse(src)
        return self._cache[module]

    def version(self) -> str | None:
        """The distribution version written in a wheel's METADATA, or sglang/version.py."""
        if self._zip is not None:
            meta = next((n for n in self._names if n.endswith(".dist-info/METADATA")), None)
            if meta:
                for line in self._zip.read(meta).decode().splitlines():
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
        src = self.source("sglang.version")
        if src:
            for node in ast.parse(src).body:
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                    if any(getattr(t, "id", "") == "__version__" for t in node.targets):
                        return str(node.value.value)
        return None

    def resolve(self, target: str) -> Resolved | str:
        """Resolve a dotted target; a string is the reason it could not be found."""
        parts = target.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:cut])
            tree = self.tree(module)
            if tree is not None:
                return _walk(target, module, self.module_file(module) or module, tree,
                             parts[cut:])
        return f"no module of `{target}` in {self.root}"

    def calls(self, module: str, callee: str, within: str | None = None) -> list[ast.Call]:
        """Every call of a name `callee` (bare or attribute) in `module`, optionally only inside
        the function or method whose qualified name is `within` (e.g. `Class.method`)."""
        tree = self.tree(module)
        if tree is None:
            return []
        scope: ast.AST = tree
        if within is not None:
            found = _walk(within, module, module, tree, within.split("."))
            if isinstance(found, str):
                return []
            scope = found.node
        out = []
        for node in ast.walk(scope):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if name == callee:
                    out.append(node)
        return out


def _walk(target: str, module: str, file: str, tree: ast.Module,
          attrs: list[str]) -> Resolved | str:
    body: list[ast.stmt] = tree.body
    node: ast.AST | None = None
    for i, name in enumerate(attrs):
        node = _find(body, name)
        if node is None:
            where = ".".join([module, *attrs[:i]])
            return f"`{name}` is not defined in {where} ({file})"
        if i < len(attrs) - 1:
            if not isinstance(node, ast.ClassDef):
                return f"`{'.'.join([module, *attrs[: i + 1]])}` is not a class"
            body = node.body
    assert node is not None
    line = getattr(node, "lineno", 0)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        kind = "method" if len(attrs) > 1 else "function"
        return Resolved(target, kind, _params(node.args), file, line, node)
    if isinstance(node, ast.ClassDef):
        return Resolved(target, "class", (), file, line, node)
    return Resolved(target, "assignment", (), file, line, node)


def _find(body: list[ast.stmt], name: str) -> ast.AST | None:
    """The last top-level definition of `name` in a body (later definitions win, as at run
    time); definitions inside `if`/`try` blocks at that level count too."""
    found = None
    for stmt in body:
        for node in _flatten(stmt):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name == name:
                    found = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    found = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                    found = node
    return found


def _flatten(stmt: ast.stmt) -> list[ast.stmt]:
    if isinstance(stmt, (ast.If, ast.Try)):
        out: list[ast.stmt] = []
        blocks = [stmt.body, stmt.orelse]
        if isinstance(stmt, ast.Try):
            blocks += [h.body for h in stmt.handlers] + [stmt.finalbody]
        for block in blocks:
            for s in block:
                out.extend(_flatten(s))
        return out
    return [stmt]


def _params(args: ast.arguments) -> tuple[Param, ...]:
    positional = [*args.posonlyargs, *args.args]
    n_def = len(args.defaults)
    out = [Param(a.arg, "positional", i >= len(positional) - n_def)
           for i, a in enumerate(positional)]
    if args.vararg:
        out.append(Param(args.vararg.arg, "varargs", False))
    out += [Param(a.arg, "keyword", d is not None) for a, d in zip(args.kwonlyargs,
                                                                    args.kw_defaults)]
    if args.kwarg:
        out.append(Param(args.kwarg.arg, "varkw", False))
    return tuple(out)


def call_keywords(call: ast.Call) -> tuple[str, ...]:
    return tuple(k.arg for k in call.keywords if k.arg is not None)


def result_index(call: ast.Call, tree: ast.AST) -> int | None:
    """If the call's result is subscripted with a constant (`f(...)[0]`), that index."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and node.value is call:
            sl = node.slice
            if isinstance(sl, ast.Constant) and isinstance(sl.value, int):
                return sl.value
    return None
