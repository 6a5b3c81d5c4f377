"""A vLLM source tree read by AST: a wheel (zip) or a directory holding `vllm/`.

`SourceTree` (plugin/static.py) resolves dotted targets and finds calls in any package read
from a zip; this adds what a vLLM tree needs on top: the file list and the version of a
directory, the module of a file, and the type of an annotation as `vllm serve`'s argument
parser and vLLM's pydantic request models see it (`TypeDesc`). Nothing is imported; no torch.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from dsv4bisect.plugin.static import SourceTree, _find

PACKAGE = "vllm"
BUILTIN_KINDS = {"int": "int", "float": "float", "str": "str", "bool": "bool", "bytes": "bytes",
                 "list": "list", "List": "list", "tuple": "list", "Tuple": "list",
                 "set": "list", "Set": "list", "frozenset": "list", "Sequence": "list",
                 "Iterable": "list", "dict": "dict", "Dict": "dict", "Mapping": "dict",
                 "MutableMapping": "dict", "Any": "any", "object": "any", "None": "none",
                 "Callable": "any", "type": "any", "Path": "str", "JsonValue": "any"}
WRAPPERS = ("Annotated", "Required", "NotRequired", "ClassVar", "Final", "TypeAlias")
MAX_DEPTH = 6  # alias hops (`CacheDType = Literal[...]`, re-exports through __init__)


class VllmTree(SourceTree):
    """A vLLM wheel or source directory."""

    PACKAGE = PACKAGE

    def py_files(self) -> list[str]:
        if self._zip is not None:
            return sorted(n for n in self._names if n.endswith(".py") and n.startswith("vllm/"))
        return sorted(str(p.relative_to(self.root)) for p in (self.root / PACKAGE).rglob("*.py"))

    def is_vllm(self) -> bool:
        return self.module_file("vllm") is not None or self.module_file("vllm.envs") is not None


def module_of(rel: str) -> str:
    """`vllm/a/b.py` -> `vllm.a.b`; `vllm/a/__init__.py` -> `vllm.a`."""
    return rel[:-3].replace("/", ".").removesuffix(".__init__")


def absolute_import(module: str, rel_file: str, node: ast.ImportFrom) -> str | None:
    """The absolute module of `from X import ...` written in `rel_file` (relative imports
    resolved against the file's package)."""
    if not node.level:
        return node.module
    package = module_of(rel_file).split(".")
    if not rel_file.endswith("__init__.py"):
        package = package[:-1]
    if node.level > 1:
        package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


class Types:
    """Annotation -> TypeDesc, resolving names through the tree (aliases, re-exports,
    classes). A TypeDesc is a JSON dict: `kinds` (sorted: bool int float str bytes list dict
    none any config enum), optional `choices` (every member a Literal) and `config` (the
    dataclass / pydantic model a `config` kind names)."""

    def __init__(self, tree: VllmTree) -> None:
        self.tree = tree
        self.classes: dict[str, tuple[str, ast.ClassDef]] = {}  # "module.Class" -> node

    def of(self, node: ast.AST | None, module: str, depth: int = 0) -> dict[str, Any]:
        kinds: set[str] = set()
        choices: list[Any] = []
        configs: list[str] = []
        literal_only = [True]
        self._collect(node, module, depth, kinds, choices, configs, literal_only)
        out: dict[str, Any] = {"kinds": sorted(kinds)}
        if choices and literal_only[0]:
            out["choices"] = choices
        if configs:
            out["config"] = configs[0]
        return out

    def _collect(self, node: ast.AST | None, module: str, depth: int, kinds: set[str],
                 choices: list[Any], configs: list[str], literal_only: list[bool]) -> None:
        if node is None:
            kinds.add("any")
            return
        if isinstance(node, ast.Constant):
            if node.value is None:
                kinds.add("none")
            elif isinstance(node.value, str):  # a forward reference: "Foo | None"
                try:
                    inner = ast.parse(node.value, mode="eval").body
                except SyntaxError:
                    kinds.add("any")
                    return
                self._collect(inner, module, depth, kinds, choices, configs, literal_only)
            else:
                kinds.add("any")
            return
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            for side in (node.left, node.right):
                self._collect(side, module, depth, kinds, choices, configs, literal_only)
            return
        if isinstance(node, ast.Subscript):
            head = _name(node.value)
            args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if head == "Literal":
                for a in args:
                    if isinstance(a, ast.Constant):
                        kinds.add({bool: "bool", int: "int", float: "float"}.get(
                            type(a.value), "str") if a.value is not None else "none")
                        if a.value is not None:
                            choices.append(a.value)
                    else:
                        self._collect(a, module, depth, kinds, choices, configs, literal_only)
                return
            if head in ("Optional",):
                kinds.add("none")
                self._collect(args[0], module, depth, kinds, choices, configs, literal_only)
                return
            if head == "Union":
                for a in args:
                    self._collect(a, module, depth, kinds, choices, configs, literal_only)
                return
            if head in WRAPPERS:
                self._collect(args[0], module, depth, kinds, choices, configs, literal_only)
                return
            if head in BUILTIN_KINDS:
                literal_only[0] = False
                kinds.add(BUILTIN_KINDS[head])
                return
            self._collect(node.value, module, depth, kinds, choices, configs, literal_only)
            return
        name = _name(node)
        if name is None:
            literal_only[0] = False
            kinds.add("any")
            return
        if name in BUILTIN_KINDS and not isinstance(node, ast.Attribute):
            literal_only[0] = False
            kinds.add(BUILTIN_KINDS[name])
            return
        if isinstance(node, ast.Attribute):  # torch.dtype, enum members ...
            literal_only[0] = False
            kinds.add("any")
            return
        found = self.lookup(name, module, depth)
        if found is None:
            literal_only[0] = False
            kinds.add("any")
            return
        where, defn = found
        if isinstance(defn, ast.ClassDef):
            literal_only[0] = False
            if _is_enum(defn):
                kinds.add("enum")
                kinds.add("str")
            elif _is_structured(defn):
                kinds.add("config")
                configs.append(defn.name)
                self.classes.setdefault(defn.name, (where, defn))
            else:
                kinds.add("any")
            return
        value = getattr(defn, "value", None)
        if isinstance(defn, (ast.Assign, ast.AnnAssign)) and value is not None \
                and depth < MAX_DEPTH:
            if isinstance(value, ast.Call) and _name(value.func) in ("TypeVar", "NewType"):
                literal_only[0] = False
                kinds.add("any")
                return
            self._collect(value, where, depth + 1, kinds, choices, configs, literal_only)
            return
        literal_only[0] = False
        kinds.add("any")

    def lookup(self, name: str, module: str, depth: int = 0
               ) -> tuple[str, ast.AST] | None:
        """Where `name` is defined as seen from `module` (following `from X import name`)."""
        if depth > MAX_DEPTH:
            return None
        tree = self.tree.tree(module)
        if tree is None:
            return None
        node = _find(tree.body, name)
        if node is None:
            return None
        if isinstance(node, ast.ImportFrom):
            rel = self.tree.module_file(module) or module.replace(".", "/") + ".py"
            source = absolute_import(module, rel, node)
            alias = next(a for a in node.names if (a.asname or a.name) == name)
            if source is None or not source.startswith(PACKAGE):
                return None
            found = self.lookup(alias.name, source, depth + 1)
            if found is None and self.tree.module_file(f"{source}.{alias.name}") is not None:
                return None  # a submodule, not a type
            return found
        if isinstance(node, ast.Import):
            return None
        return module, node

    def class_def(self, name: str, module: str) -> tuple[str, ast.ClassDef] | None:
        found = self.lookup(name, module)
        if found is None or not isinstance(found[1], ast.ClassDef):
            return None
        return found[0], found[1]


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_enum(cls: ast.ClassDef) -> bool:
    return any((_name(b) or "").endswith("Enum") for b in cls.bases)


def _is_structured(cls: ast.ClassDef) -> bool:
    """A dataclass, a vLLM `@config` class or a pydantic model: JSON objects with fields."""
    decorators = {(_name(d.func) if isinstance(d, ast.Call) else _name(d)) for d in
                  cls.decorator_list}
    if decorators & {"dataclass", "config"}:
        return True
    return any(_name(b) in ("BaseModel", "OpenAIBaseModel") or (_name(b) or "").endswith(
        ("Config", "Model", "Params", "Args")) for b in cls.bases)


def dataclass_fields(types: Types, module: str, cls: ast.ClassDef, depth: int = 0
                     ) -> dict[str, dict[str, Any]]:
    """The fields of a dataclass / pydantic model, base classes first (inside vllm only):
    name -> {type: TypeDesc, default: repr or absent, line}."""
    out: dict[str, dict[str, Any]] = {}
    if depth < MAX_DEPTH:
        for base in cls.bases:
            bname = _name(base)
            if bname is None:
                continue
            found = types.class_def(bname, module)
            if found is not None and found[1] is not cls:
                out.update(dataclass_fields(types, found[0], found[1], depth + 1))
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            ann = ast.unparse(stmt.annotation)
            if ann.startswith("ClassVar") or stmt.target.id.startswith("_"):
                continue
            row: dict[str, Any] = {"type": types.of(stmt.annotation, module),
                                   "line": stmt.lineno}
            if stmt.value is not None:
                row["default"] = default_text(stmt.value)
            out[stmt.target.id] = row
    return out


def default_text(value: ast.AST) -> Any:
    """A field's default as JSON where it is a literal, else its source text (`"<expr>"`),
    reading through `Field(default, ...)` / `field(default=...)`."""
    if isinstance(value, ast.Call) and _name(value.func) in ("Field", "field"):
        for kw in value.keywords:
            if kw.arg == "default":
                return default_text(kw.value)
            if kw.arg in ("default_factory",):
                return f"<{ast.unparse(kw.value)}()>"
        if value.args:
            return default_text(value.args[0])
        return "<required>"
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError):
        return f"<{ast.unparse(value)}>"


def open_tree(path: str | Path) -> VllmTree:
    tree = VllmTree(path)
    if not tree.is_vllm():
        raise FileNotFoundError(f"{path} holds no vllm/ package")
    return tree
