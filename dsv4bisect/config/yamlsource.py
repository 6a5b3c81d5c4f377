"""YAML loading that remembers where every key came from (for `file:line:col:` errors).

`yaml.safe_load` semantics (no custom tags), plus: duplicate keys are errors, and every mapping
key and sequence item gets a `Mark` so that validation errors point into the file. The text is
read and checked by `bounded.py` (size, UTF-8, depth, node count, no anchors or aliases) before
any recursive part of PyYAML runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dsv4bisect.base import bounded
from dsv4bisect.errors import ConfigError

KeyPath = tuple[Any, ...]


@dataclass(frozen=True)
class Mark:
    file: str
    line: int  # 1-based
    col: int  # 1-based

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True)
class YamlDoc:
    path: Path
    data: Any
    marks: dict[KeyPath, Mark]  # () = the document; ("engine", "tp") = the key `tp`


def load_yaml(path: Path, *, display: str | None = None, kind: str = "profile") -> YamlDoc:
    """Load one YAML file; syntax errors and duplicate keys raise ConfigError with a position."""
    shown = display or str(path)
    text = bounded.read_text(path, kind, shown=shown)
    node, loader = bounded.compose_yaml(text, kind, shown)
    try:
        marks: dict[KeyPath, Mark] = {(): Mark(shown, 1, 1)}
        if node is not None:
            _walk(node, (), shown, marks)
        data = bounded.construct(loader, node, shown) if node is not None else None
    finally:
        loader.dispose()
    return YamlDoc(path=path, data=data, marks=marks)


def _walk(node: yaml.Node, path: KeyPath, shown: str, marks: dict[KeyPath, Mark]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            # A collection as a key is refused by the constructor later; name it briefly here.
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else key_node.id
            mark = _mark(key_node, shown)
            if key in seen:
                first = _mark(seen[key], shown)
                raise ConfigError(
                    f"{mark}: duplicate key `{key}` (first at line {first.line})",
                    "YAML keeps only one of them; remove or rename the duplicate",
                )
            seen[key] = key_node
            marks[path + (key,)] = mark
            _walk(value_node, path + (key,), shown, marks)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            marks[path + (index,)] = _mark(item, shown)
            _walk(item, path + (index,), shown, marks)


def _mark(node: yaml.Node, shown: str) -> Mark:
    return Mark(shown, node.start_mark.line + 1, node.start_mark.column + 1)
