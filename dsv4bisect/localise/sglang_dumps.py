"""SGLang's dumps as a `Capture`: read with the release's own `dump_loader.py` code, every dumped
module input and output placed at its (sequence, position).

The loader's pure part — `parse_meta_from_filename` (the file naming), `ValueWithMeta.load` and
`_unwrap_dict_format` (the saved format) — is taken from the release's source and executed as
it is (`release_loader`); its `read_meta` builds a polars table, which this machine may not
have, so the directory is walked here and each file parsed by those functions.

Alignment: each forward step dumps the batch's `input_ids` and `positions` (the non-intrusive
dumper's core fields, from the ForwardBatch at the model's root). A step's rows form runs of
consecutive positions, one per request; a run is matched to the transcript whose tokens at those
positions it holds (transcripts that share a prefix compute the same numbers there, so the first
match is as good as any). A dumped tensor with one row per token of the step is split over the
runs; any other shape (weights, per-request tensors) is left out.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dsv4bisect.localise.sites import Capture, Site, SiteRows

_KEEP = ("parse_meta_from_filename", "_TYPED_FIELDS", "_unwrap_dict_format", "ValueWithMeta",
         "LOAD_FAILED")
_NAME = re.compile(r"^(?P<module>.*?)\.?(?P<sub>output|inputs\.[^.]+)(?:\.(?P<key>[^.]+))?$")
NAME_PREFIX = "non_intrusive__"


def release_loader(source: str) -> dict[str, Any]:
    """The pure functions of a release's dump_loader.py, executed from its own text."""
    tree = ast.parse(source)
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names]
            if any(n.split(".")[0] == "polars" for n in names) or (
                    isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang")):
                continue
            body.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in _KEEP:
            body.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(getattr(t, "id", None) in _KEEP for t in targets):
                body.append(node)
    name = f"_sglang_release_dump_loader_{hashlib.sha256(source.encode()).hexdigest()[:12]}"
    module = sys.modules.get(name) or types.ModuleType(name)
    sys.modules[name] = module  # a dataclass looks its module up there
    code = compile(ast.Module(body=body, type_ignores=[]), "dump_loader.py", "exec")
    exec(code, module.__dict__)  # noqa: S102 - the release's own loader functions, as written
    ns = module.__dict__
    missing = [k for k in _KEEP if k not in ns]
    if missing:
        raise ValueError(f"the release's dump_loader.py has no {', '.join(missing)}")
    return ns


def parse_name(name: str) -> tuple[str, str] | None:
    """`non_intrusive__layers.0.self_attn.output` -> ("layers.0.self_attn", "output")."""
    if not name.startswith(NAME_PREFIX):
        return None
    m = _NAME.match(name[len(NAME_PREFIX):])
    if m is None:
        return None
    sub = m.group("sub") + (f".{m.group('key')}" if m.group("key") else "")
    return m.group("module"), sub


def _runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """[start row, end row) of each run of consecutive positions (one request each)."""
    cuts = [0] + [i for i in range(1, len(positions)) if positions[i] != positions[i - 1] + 1]
    return list(zip(cuts, [*cuts[1:], len(positions)], strict=True))


def _match(tokens: np.ndarray, start: int, transcripts: Sequence[Sequence[int]]) -> int | None:
    for k, ids in enumerate(transcripts):
        end = start + len(tokens)
        if end <= len(ids) and np.array_equal(np.asarray(ids[start:end]), tokens):
            return k
    return None


def load_capture(exp_dir: str | Path, loader: dict[str, Any],
                 transcripts: Sequence[Sequence[int]], label: str = "") -> Capture:
    """Every dump of one experiment directory as a Capture over `transcripts`' sequences."""
    import torch

    load = loader["ValueWithMeta"].load
    failed = loader["LOAD_FAILED"]
    items = []
    for path in sorted(Path(exp_dir).glob("*.pt")):
        item = load(path)
        if item.value is failed or not isinstance(item.value, torch.Tensor):
            continue
        items.append((int(item.meta.get("rank", 0)), int(item.meta["step"]),
                      int(item.meta["dump_index"]), str(item.meta["name"]), item.value,
                      item.meta))
    items.sort(key=lambda x: (x[0], x[2]))
    ranks = {r for r, *_ in items}
    cap = Capture(label=label)
    steps: dict[tuple[int, int], dict[str, Any]] = {}
    for rank, step, _, name, value, _ in items:
        if name in ("input_ids", "positions"):
            steps.setdefault((rank, step), {})[name] = value.reshape(-1).long().numpy()
    for rank, step, _, name, value, _ in items:
        got = parse_name(name)
        batch = steps.get((rank, step))
        if got is None or batch is None or "positions" not in batch:
            continue
        module, sub = got
        pos, tok = batch["positions"], batch.get("input_ids")
        if value.dim() == 0 or value.shape[0] != len(pos):
            continue
        key = f"{module}:{sub}" + (f":rank{rank}" if len(ranks) > 1 else "")
        if key not in cap.sites:
            inputs = tuple(k for k, s in cap.sites.items()
                           if s.module == module and s.slot.startswith("inputs"))
            cap.sites[key] = Site(key, module, sub.split(".")[0], sub, len(cap.sites),
                                  inputs if sub.startswith("output") else ())
            cap.rows[key] = SiteRows()
        flat = value.detach().reshape(value.shape[0], -1)
        rows = (flat.float() if flat.is_floating_point() else flat.long()).numpy()
        for a, b in _runs(pos):
            seq = 0 if tok is None else _match(tok[a:b], int(pos[a]), transcripts)
            if seq is not None:
                cap.rows[key].add(seq, pos[a:b].copy(), rows[a:b].copy())
    return cap
