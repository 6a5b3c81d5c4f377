"""A release's own `dumper.py`, loaded from its wheel to write real dumps on CPU tensors.

0.5.13 to 0.5.15.post1 import here as they are (stdlib and torch). From 0.5.16 the module imports
zmq and `sglang.srt.{managers.io_struct,runtime_context,utils}` at its top, for its control RPC
and the rank/device queries of a multi-process engine; those cannot import here (no zmq, no
SGLang runtime). They are cut and their names bound to placeholders that raise if touched, and
the rest of the file runs as it is: the dump path of a single-process, rank-0 dumper without a
server port never touches them (a test that reached one would fail, not pass). `how` says which
of the two it was.
"""

from __future__ import annotations

import ast
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

DUMPER = "sglang/srt/debug_utils/dumper.py"
LOADER = "sglang/srt/debug_utils/dump_loader.py"


class Unavailable:
    """A name the release imports from a package this machine lacks."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        raise RuntimeError(f"the dump path touched `{self._name}.{attr}`")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"the dump path called `{self._name}`")


def _cut(tree: ast.Module) -> tuple[ast.Module, list[str]]:
    body, cut = [], []
    for node in tree.body:
        mod = node.module if isinstance(node, ast.ImportFrom) else None
        names = [a.asname or a.name for a in node.names] if isinstance(
            node, (ast.Import, ast.ImportFrom)) else []
        if (isinstance(node, ast.Import) and any(a.name == "zmq" for a in node.names)) or (
                mod is not None and mod.startswith("sglang")):
            cut += names
            continue
        body.append(node)
    return ast.Module(body=body, type_ignores=[]), cut


def load(wheel: Path) -> tuple[types.ModuleType, str]:
    text = zipfile.ZipFile(wheel).read(DUMPER).decode("utf-8")
    name = "_sglang_release_dumper_" + wheel.name.split("-")[1].replace(".", "_")
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(text, f"{wheel.name}:{DUMPER}", "exec"), module.__dict__)  # noqa: S102
        return module, "imported as it is"
    except ModuleNotFoundError:
        pass
    module = types.ModuleType(name)
    sys.modules[name] = module
    tree, cut = _cut(ast.parse(text))
    module.__dict__.update({n: Unavailable(n) for n in cut})
    exec(compile(tree, f"{wheel.name}:{DUMPER}", "exec"), module.__dict__)  # noqa: S102
    return module, f"imported with {', '.join(cut)} cut (placeholders that raise if used)"


def loader_source(wheel: Path) -> str:
    return zipfile.ZipFile(wheel).read(LOADER).decode("utf-8")
