"""The fingerprint: one hash that identifies an experiment on any machine (DESIGN §4).

It covers the canonical engine configuration (processes with symbolic ports, interpreter, model
path and worktree path; patch set), the model's identity (its config.json and shard index, not
its path), the engine's version (SGLang's installed version or the profile's; the embedded
engine's source) and the hash of the patch, kernel and plugin code. The probe's version is not
part of it: every key built on a fingerprint (ledger trials, cached baselines) pairs it with the
probe spec's hash, which carries the probe version.
Volatile fields (ports chosen `auto`, run directories, receipt paths, cache paths) are left out.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from functools import cache
from pathlib import Path
from typing import Any

from dsv4bisect.config.layering import is_file

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # dsv4bisect/
MODEL_ID_FILES = ("config.json", "model.safetensors.index.json", "hf_quant_config.json")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def digest(value: Any, length: int = 16) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:length]


def _hash_files(labelled: list[tuple[str, Path]]) -> str:
    """Hash of (label, content) pairs; labels are machine-independent relative names."""
    return _hash_contents([(label, path.read_bytes()) for label, path in labelled])


def _hash_contents(labelled: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for label, content in sorted(labelled):
        h.update(label.encode() + b"\0" + content + b"\0")
    return h.hexdigest()[:16]


def _sources(*subdirs: str) -> list[tuple[str, Path]]:
    import dsv4bisect.kernels
    import dsv4bisect.patches

    roots = {
        "patches": Path(dsv4bisect.patches.__file__).parent,
        "kernels": Path(dsv4bisect.kernels.__file__).parent,
    }
    files: list[tuple[str, Path]] = []
    for sub in subdirs:
        root = roots.get(sub, PACKAGE_ROOT / sub)
        if root.is_dir():
            files += [(f"{sub}/{p.relative_to(root)}", p) for p in root.rglob("*.py")
                      if "__pycache__" not in p.parts]
    return files


# Plugin modules that only the CLI runs (the static checks of a wheel), never an engine process:
# a change to them changes no experiment, so it must not change every fingerprint.
CLI_ONLY = frozenset({"plugin/static.py"})


@cache
def code_hash() -> str:
    """The patch, kernel and plugin code an engine runs (the patches' declarations and hook
    bodies, the installer; test-only patch modules from outside the package when the
    environment registers them), and the foundation it imports (release data, the switch-file
    protocol): a change to any of it is a new experiment (the CLI-only plugin checks are left
    out)."""
    from dsv4bisect.patching.registry import extra_module_files

    files = [f for f in _sources("patches", "kernels", "plugin", "sglang_hooks", "vllm_hooks",
                                 "patchspec", "base") if f[0] not in CLI_ONLY]
    files += [(f"test-patches/{p.name}", p) for p in extra_module_files()]
    return _hash_files(files) if files else "none"


def source_hash(*subdirs: str) -> str:
    """The Python sources of these package folders (e.g. "microtest", "kernels")."""
    files = _sources(*subdirs)
    return _hash_files(files) if files else "none"


@cache
def reference_engine_version() -> str:
    """The embedded engine is versioned by its source (model, engine, server, tokenizer)."""
    files = _sources("reference")
    return "reference-" + (_hash_files(files) if files else "none")


def installed_sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_vllm_version() -> str | None:
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


def model_identity(path: str | None) -> dict[str, Any]:
    """Content identity of a checkpoint directory (its config and shard index), not its path."""
    if not path:
        return {"model": None}
    if "\0" in path or len(path) > 4096:
        return {"model": "unavailable-here", "name": path[:80]}
    directory = Path(path).expanduser()
    found = [directory / name for name in MODEL_ID_FILES if is_file(directory / name)]
    if not found:
        return {"model": "unavailable-here", "name": directory.name}
    # The model path is user input: its files are read through the bounded loader.
    from dsv4bisect.base.bounded import read_bytes

    kinds = {"model.safetensors.index.json": "checkpoint-index"}
    return {"model": _hash_contents([(p.name, read_bytes(p, kinds.get(p.name,
                                                                       "checkpoint-config")))
                                     for p in found])}

