"""Static checks of SGLang source by AST: does a hook target exist, with which signature?

Works on a source tree (a directory holding `sglang/`, e.g. a checkout's `python/` folder or an
unpacked wheel) or directly on a wheel file, without importing SGLang (its imports need CUDA
libraries this machine may not have). Used by `dsv4bisect doctor --sglang-src` and the
wheel-based tests. Imports no torch.

Every file is read through base/bounded.py (kind `source`): a wheel's declared sizes and entry
count are checked when it is opened, a member is decompressed only up to the per-file limit, a
file must be UTF-8, and a syntax tree deeper than the recursive walks here can follow is
refused; each is a ConfigError (exit 5) naming the file, never a traceback or a gigabyte.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from dsv4bisect.base import bounded
from dsv4bisect.errors import ConfigError

SOURCE = "source"  # base/bounded.py's limits for one file
MAX_TREE_FILES = bounded.MAX_ARCHIVE_ENTRIES  # .py files of a directory tree


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

    PACKAGE = "sglang"  # whose version files `version()` reads (VllmTree: vllm)

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if not self.root.exists():
            raise FileNotFoundError(f"{self.root} does not exist")
        self._zip = (bounded.open_archive(self.root, bounded.LIMITS[SOURCE].hint)
                     if self.root.is_file() else None)
        self._cache: dict[str, ast.Module | None] = {}

    def __repr__(self) -> str:
        return f"SourceTree({str(self.root)!r})"

    @cached_property
    def _names(self) -> frozenset[str]:
        return frozenset(self._zip.namelist()) if self._zip else frozenset()

    def _read(self, rel: str) -> str | None:
        if self._zip is not None:
            if rel not in self._names:
                return None
            return bounded.decode(bounded.read_member(self._zip, rel, SOURCE),
                                  f"{self.root}:{rel}")
        base = self.root / "sglang"
        path = (self.root / rel) if base.is_dir() or not (self.root / "python").is_dir() \
            else self.root / "python" / rel
        return bounded.read_text(path, SOURCE) if path.is_file() else None

    def parse(self, rel: str, text: str) -> ast.Module:
        """The syntax tree of one file's text (SyntaxError: the file is broken; a tree too
        deep or too large to walk: ConfigError)."""
        return bounded.parse_python(text, SOURCE, f"{self.root}:{rel}")

    def text(self, rel: str) -> str | None:
        """The text of one file of the tree (`sglang/...`), None when absent."""
        return self._read(rel)

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
            rel = self.module_file(module)
            src = None if rel is None else self._read(rel)
            self._cache[module] = None if src is None or rel is None else self.parse(rel, src)
        return self._cache[module]

    def version(self) -> str | None:
        """The distribution version written in a wheel's METADATA, else the version file that
        setuptools-scm writes (`sglang/_version.py`), else a constant in `sglang/version.py`.
        None for a git checkout that was never built (its version proves nothing)."""
        if self._zip is not None:
            meta = next((n for n in self._names if n.endswith(".dist-info/METADATA")), None)
            if meta:
                data = bounded.read_member(self._zip, meta, SOURCE)
                for line in data.decode("utf-8", "replace").splitlines():
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
        for module in (f"{self.PACKAGE}._version", f"{self.PACKAGE}.version"):
            try:
                tree = self.tree(module)
            except (SyntaxError, ValueError, UnicodeDecodeError):
                continue
            for node in tree.body if tree is not None else []:
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and \
                        isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if any(getattr(t, "id", "") in ("__version__", "version") for t in targets):
                        return str(node.value.value)
        return None

    def resolve(self, target: str) -> Resolved | str:
        """Resolve a dotted target; a string is the reason it could not be found (naming where
        the symbol is defined now, when the tree has it elsewhere)."""
        parts = target.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:cut])
            tree = self.tree(module)
            if tree is None:
                continue
            if cut < len(parts) - 1 and _find(tree.body, parts[cut]) is None \
                    and self._is_package(module):
                break  # `pkg.missing_module.sym`: the module is gone, not a name in pkg
            found = _walk(target, module, self.module_file(module) or module, tree,
                          parts[cut:])
            if isinstance(found, str):
                return found + self._moved_hint(parts[-1], target)
            return found
        return f"no module `{'.'.join(parts[:-1])}` in {self.root.name}" + \
            self._moved_hint(parts[-1], target)

    def _is_package(self, module: str) -> bool:
        rel = self.module_file(module)
        return rel is not None and rel.endswith("__init__.py") or self._is_namespace(module)

    def _is_namespace(self, module: str) -> bool:
        prefix = module.replace(".", "/") + "/"
        return any(n.startswith(prefix) for n in self.py_files())

    def py_files(self) -> list[str]:
        """Every .py file of the tree, relative (`sglang/...`)."""
        if self._zip is not None:
            return sorted(n for n in self._names if n.endswith(".py"))
        base = self.root / "python" if (self.root / "python" / "sglang").is_dir() else self.root
        found = []
        for path in (base / "sglang").rglob("*.py"):
            found.append(str(path.relative_to(base)))
            if len(found) > MAX_TREE_FILES:
                raise ConfigError(f"{base / 'sglang'}: more than {MAX_TREE_FILES} .py files "
                                  "(an SGLang release has about 3 000)",
                                  bounded.LIMITS[SOURCE].hint)
        return sorted(found)

    def find_definitions(self, name: str, limit: int = 3) -> list[str]:
        """Dotted paths of top-level or class-level defs/classes called `name` (a text search
        first, then AST), for saying where a moved target went."""
        needle_def, needle_cls = f"def {name}(", f"class {name}"
        out: list[str] = []
        for rel in self.py_files():
            if rel.startswith("sglang/test/"):
                continue
            text = self._read(rel) or ""
            if needle_def not in text and needle_cls not in text:
                continue
            module = rel[:-3].replace("/", ".").removesuffix(".__init__")
            for node in self.parse(rel, text).body:
                if getattr(node, "name", None) == name:
                    out.append(f"{module}.{name}")
                elif isinstance(node, ast.ClassDef):
                    out += [f"{module}.{node.name}.{name}" for n in node.body
                            if getattr(n, "name", None) == name]
            if len(out) >= limit:
                break
        return out[:limit]

    def _moved_hint(self, name: str, target: str) -> str:
        found = [f for f in self.find_definitions(name) if f != target]
        return f"; now defined at {', '.join(found)}" if found else ""

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
                alias = _alias_of(node)
                what = f"`{'.'.join([module, *attrs[: i + 1]])}`"
                if alias:  # e.g. 0.5.23: `DeepseekV4DecoderLayer = A if _is_cuda else B`
                    return f"{what} is an alias of {' / '.join(alias)}, not a class"
                return f"{what} is not a class"
            body = node.body
    assert node is not None
    line = getattr(node, "lineno", 0)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        kind = "method" if len(attrs) > 1 else "function"
        return Resolved(target, kind, _params(node.args), file, line, node)
    if isinstance(node, ast.ClassDef):
        return Resolved(target, "class", (), file, line, node)
    return Resolved(target, "assignment", (), file, line, node)


def _alias_of(node: ast.AST) -> list[str]:
    """The names an assignment may bind (`X = A`, `X = A if c else B`, `X = (A if c else B)`)."""
    value = getattr(node, "value", None)
    out: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, ast.Name):
            out.append(v.id)
        elif isinstance(v, ast.IfExp):
            stack += [v.orelse, v.body]
    return out


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


@dataclass(frozen=True)
class ForcedFlag:
    """A flag SGLang sets for DeepSeek-V4 on SM120 before the model loads."""

    name: str  # env var, or `--moe-runner-backend auto`
    value: str
    forced: bool  # False: only when the user left it unset (a default, not a force)
    where: str  # file:line


_SM120_MARK = "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"  # set in every release's DeepSeek-V4 SM120 block
_FLAG_MODULES = ("sglang.srt.server_args", "sglang.srt.arg_groups.model_hook")


def sm120_forced_flags(src: SourceTree) -> list[ForcedFlag]:
    """The env flags (and MoE runner default) SGLang sets for DeepSeek-V4 on SM120, read from
    the release's own server-args code: the innermost `if ...sm120...:` block that sets
    SGLANG_FP8_PAGED_MQA_LOGITS_TORCH. `envs.X.set(V)` directly in it is forced; under
    `if not envs.X.is_set():` it is a default the user can override."""
    for module in _FLAG_MODULES:
        tree = src.tree(module)
        if tree is None:
            continue
        file = src.module_file(module) or module
        blocks = [n for n in ast.walk(tree) if isinstance(n, ast.If)
                  and "sm120" in ast.unparse(n.test).lower()
                  and any(_sets_mark(c) for s in n.body for c in ast.walk(s))]
        if blocks:
            block = min(blocks, key=lambda n: (n.end_lineno or 0) - n.lineno)
            return _flags_in(block.body, file)
    return []


def _sets_mark(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and _set_flag_name(node) == _SM120_MARK


def _set_flag_name(call: ast.Call) -> str | None:
    """`envs.NAME.set(...)` -> NAME."""
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == "set" and isinstance(f.value, ast.Attribute):
        return f.value.attr
    return None


def _flags_in(body: list[ast.stmt], file: str, guarded: str | None = None) -> list[ForcedFlag]:
    out: list[ForcedFlag] = []
    for stmt in body:
        if isinstance(stmt, ast.If):
            test = ast.unparse(stmt.test)
            guard = None
            if test.startswith("not envs.") and test.endswith(".is_set()"):
                guard = test[len("not envs."):-len(".is_set()")]
            if "moe_runner_backend" in test and "'auto'" in test.replace('"', "'"):
                for s in stmt.body:
                    if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant):
                        out.append(ForcedFlag("--moe-runner-backend auto", str(s.value.value),
                                              False, f"{file}:{s.lineno}"))
                continue
            out += _flags_in(stmt.body, file, guard)
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and (name := _set_flag_name(node)) and node.args:
                arg = node.args[0]
                value = ast.unparse(arg) if not isinstance(arg, ast.Constant) else str(arg.value)
                out.append(ForcedFlag(name, value, guarded != name, f"{file}:{node.lineno}"))
    return out
