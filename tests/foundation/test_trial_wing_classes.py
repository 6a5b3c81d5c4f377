"""Issue 38's Done-when, kept: every class of the trial wing (`bisect/trials/`, `bisect/cluster/`)
is at most 300 lines, so a runner stays composed of parts (docs/architecture.md, "The runner
in parts") instead of growing back into one class."""

from __future__ import annotations

import ast
from pathlib import Path

import dsv4bisect

LIMIT = 300
WING = ("bisect/trials", "bisect/cluster")


def test_every_class_of_the_trial_wing_is_at_most_300_lines() -> None:
    root = Path(dsv4bisect.__file__).parent
    sizes = {}
    for part in WING:
        for path in sorted((root / part).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    assert node.end_lineno is not None
                    sizes[f"{part}/{path.name}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert sizes, "no class found: the wing moved"
    assert {name: n for name, n in sizes.items() if n > LIMIT} == {}
