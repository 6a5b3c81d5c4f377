"""Count the code statements of `dsv4bisect/` by AST: comments, docstrings and blank lines do
not count, so the figure moves only when code does.

    python tests/benchmarks/code_statements.py [ROOT ...]   # default: the package's folders

Every `ast.stmt` node counts once (a `def` is one statement, each statement in its body one
more); a docstring (a bare string expression first in a module, class or function body) is
not counted. The package's top-level folders (`kernels/`, `patches/`, `profiles/`) are mapped
into `dsv4bisect` at install time and count too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ("dsv4bisect", "kernels", "patches", "profiles")


def _is_docstring(node: ast.stmt, parent: ast.AST) -> bool:
    body = getattr(parent, "body", None)
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and isinstance(parent, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and bool(body)
        and body[0] is node
    )


def statements(source: str) -> int:
    tree = ast.parse(source)
    count = 0
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            if isinstance(child, ast.stmt) and not _is_docstring(child, parent):
                count += 1
    return count


def files(roots: list[Path]) -> list[Path]:
    found: set[Path] = set()
    for root in roots:
        for path in root.rglob("*.py"):
            # The worktree's dsv4bisect/{kernels,patches,profiles} are symlinks to the top-level
            # folders: count those once, under their own names.
            inside = path.relative_to(root).parents
            if not any((root / part).is_symlink() for part in inside):
                found.add(path)
    return sorted(found)


def main(argv: list[str]) -> int:
    roots = [ROOT / name for name in (argv or DEFAULT)]
    paths = files([r for r in roots if r.exists()])
    total = sum(statements(p.read_text(encoding="utf-8")) for p in paths)
    print(f"{total} statements in {len(paths)} files under {', '.join(r.name for r in roots)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
