"""The microtest priors' cache: a bisect of the same question on the same checkpoint and code
takes the priors measured before instead of running the microtest again (seconds of torch
import and checks before every `bisect`, and before every `--plan`).

An entry is `$DSV4BISECT_CACHE/microtest-priors/<key>.json`. The key is a hash of everything the
priors depend on: the candidates and their coverage, the patches and variants measured, the MoE
backend, the probe's contexts, the checkpoint (every file's name, size and modification time,
and the content identity of its config), the code (the microtest, the embedded engine, the
kernels and patches it swaps in, and the prior curve, bisect/microtest_priors.py), the installed
torch, and what decides the default device without importing torch (the NVIDIA device nodes and
CUDA_VISIBLE_DEVICES). A changed file, patch or kernel is a new key; a damaged entry is ignored
and measured again. `bisect --no-cache` measures them again (and replaces the entry).
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import math
import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dsv4bisect.base.atomic import write_json
from dsv4bisect.base.bounded import load_json
from dsv4bisect.bisect.microtest_priors import CandidatePrior, Coverage, MicrotestPriors
from dsv4bisect.config.checkpoints import checkpoint_dir
from dsv4bisect.config.fingerprint import digest, model_identity, source_hash
from dsv4bisect.env import cache_dir
from dsv4bisect.errors import ConfigError

SCHEMA = "dsv4bisect.microtest-priors-cache/1"
CODE_DIRS = ("microtest", "reference", "kernels", "patches")
CURVE = Path(__file__).with_name("microtest_priors.py")


def cache_root() -> Path:
    return cache_dir() / "microtest-priors"


def priors_key(candidates: Sequence[str], cover: Mapping[str, Coverage],
               patches: Mapping[str, str], checkpoint: str, moe_backend: str,
               contexts: Sequence[int] | None) -> str:
    """The cache key of one microtest priors run (module docstring: what it covers)."""
    return digest({
        "schema": SCHEMA, "candidates": list(candidates),
        "coverage": {n: [c.measured, c.why] for n, c in sorted(cover.items())},
        "patches": dict(patches), "moe_backend": moe_backend,
        "contexts": sorted(set(contexts)) if contexts else None,
        "checkpoint": _checkpoint_identity(checkpoint),
        "code": source_hash(*CODE_DIRS),
        "curve": hashlib.sha256(CURVE.read_bytes()).hexdigest()[:16],
        "torch": _version("torch"), "device": _device_marker(),
    }, length=24)


def lookup(key: str) -> MicrotestPriors | None:
    """The cached priors for `key`, or None (absent, or damaged: measured again)."""
    path = cache_root() / f"{key}.json"
    if not path.is_file():
        return None
    try:
        data = load_json(path, "run")
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("key") != key:
            return None
        priors = tuple(CandidatePrior(str(p["name"]), float(p["multiplier"]), str(p["reason"]),
                                      _ratio_in(p["ratio"])) for p in data["priors"])
        return MicrotestPriors(priors=priors, seconds=float(data["seconds"]),
                               checkpoint=str(data["checkpoint"]),
                               cached=str(data["created_at"]))
    except (OSError, ValueError, TypeError, KeyError, ConfigError):
        return None


def store(key: str, priors: MicrotestPriors) -> None:
    """Keep `priors` (measured, not off) under `key`; a cache that cannot be written is
    skipped (the next bisect measures again)."""
    if priors.off:
        return
    entry = {
        "schema": SCHEMA, "key": key,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": priors.seconds, "checkpoint": priors.checkpoint,
        "priors": [{"name": p.name, "multiplier": p.multiplier, "reason": p.reason,
                    "ratio": _ratio_out(p.ratio)} for p in priors.priors],
    }
    try:
        write_json(cache_root() / f"{key}.json", entry)
    except OSError:
        pass


def _checkpoint_identity(checkpoint: str) -> dict[str, Any]:
    directory = checkpoint_dir(checkpoint) if checkpoint in ("embedded", "random") \
        else Path(checkpoint).expanduser()
    if directory is None:
        return {"checkpoint": "random"}  # generated from seed 0 by the engine's code
    files = []
    for path in sorted(directory.iterdir()):
        if path.is_file():
            st = path.stat()
            files.append([path.name, st.st_size, st.st_mtime_ns])
    return {"dir": str(directory.resolve()), "files": files, **model_identity(str(directory))}


def _device_marker() -> list[str]:
    """What makes torch.cuda.is_available() true, seen without importing torch."""
    return [os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"),
            *sorted(glob.glob("/dev/nvidia[0-9]*"))]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _ratio_out(r: float | None) -> float | str | None:
    return r if r is None or math.isfinite(r) else str(r)  # JSON has no inf or nan


def _ratio_in(r: object) -> float | None:
    return None if r is None else float(r)  # "inf" and "nan" parse back
