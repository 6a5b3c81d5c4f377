"""The good end's probe runs: the A/A repeat's coverage, and the baseline cache.

A baseline is one probe run of the good configuration plus an A/A repeat on the same engine (the
noise floor). It is cached under `$DSV4BISECT_CACHE/baselines/<fingerprint>-<spec hash>-b<seed
block>/` — the key the ledger uses for a trial — and reused by later runs of the same question
unless `--no-cache`:

    meta.json            the key, when and from which run directory it was made
    baseline/            the arm as the run directory holds it: probe run files (with the null
                         model's arms in null.jsonl), logs/, receipts/
    baseline-repeat/     the A/A repeat's probe run files

The smoke and standard tiers' repeat covers a subset (`REPEAT_SHORTEST_LENGTHS`): every drift
transcript and the accuracy cases at the two shortest lengths. docs/run.md says why; the judge takes its A/A
figures from the requests the repeat covered.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from dsv4bisect.base.bounded import json_object, load_json
from dsv4bisect.env import cache_dir
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.null import NULL_ARMS
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.spec import ProbeSpec

CACHE_SCHEMA = "dsv4bisect.baseline-cache/1"
BASELINE, REPEAT = "baseline", "baseline-repeat"
# Tier -> how many of its shortest lengths the A/A repeat's accuracy cases cover (absent: all).
REPEAT_SHORTEST_LENGTHS = {"smoke": 2, "standard": 2}


@dataclass(frozen=True)
class BaselineKey:
    fingerprint: str
    spec_hash: str
    seed_block: int

    @classmethod
    def of(cls, fingerprint: str, spec: ProbeSpec) -> BaselineKey:
        return cls(fingerprint, spec.spec_hash(), spec.seed_block)

    @property
    def dirname(self) -> str:
        return f"{self.fingerprint}-{self.spec_hash}-b{self.seed_block}"

    def to_dict(self) -> dict[str, object]:
        return {"fingerprint": self.fingerprint, "spec_hash": self.spec_hash,
                "seed_block": self.seed_block}


def cache_root() -> Path:
    return cache_dir() / "baselines"


def repeat_reference(base: ProbeRun) -> tuple[ProbeRun, str | None]:
    """What the A/A repeat replays: all of `base`, or the tier's documented subset (with a note)."""
    keep = REPEAT_SHORTEST_LENGTHS.get(base.spec.tier)
    lengths = sorted({c.cell.length for c in base.cases if c.family != "drift"})
    if keep is None or len(lengths) <= keep:
        return base, None
    short = set(lengths[:keep])
    cases = tuple(c for c in base.cases if c.family == "drift" or c.cell.length in short)
    ids = {c.case_id for c in cases}
    subset = replace(base, cases=cases, rows=tuple(r for r in base.rows if r["case_id"] in ids))
    n_acc = sum(c.family != "drift" for c in cases)
    total = sum(c.family != "drift" for c in base.cases)
    note = (f"A/A repeat subset ({base.spec.tier} tier): every drift transcript and the "
            f"{n_acc} of {total} accuracy cases at lengths {sorted(short)}")
    return subset, note


@dataclass(frozen=True)
class CachedBaseline:
    key: BaselineKey
    path: Path
    created_at: str
    source_run: str | None

    def install(self, arm_dir: Path, repeat_dir: Path) -> tuple[ProbeRun, ProbeRun | None]:
        """Copy the cached runs (and the logs of the launch that made them) into a run dir."""
        repeated = self.copy(arm_dir, repeat_dir)
        return ProbeRun.load(arm_dir), ProbeRun.load(repeat_dir) if repeated else None

    def copy(self, arm_dir: Path, repeat_dir: Path) -> bool:
        """`install`'s files only (the Ray driver ships them as files: cluster/shared_ends.py);
        whether the entry has its A/A repeat."""
        copy_tree(self.path / BASELINE, arm_dir, skip=("config.json",))
        if not (self.path / REPEAT / "run.json").exists():
            return False
        copy_tree(self.path / REPEAT, repeat_dir)
        return True


def lookup(key: BaselineKey) -> tuple[CachedBaseline | None, str | None]:
    """The cached baseline for `key`, or (None, why not) — a damaged entry is ignored."""
    path = cache_root() / key.dirname
    if not (path / "meta.json").exists():
        return None, None
    try:
        meta = json_object(load_json(path / "meta.json", "run"), str(path / "meta.json"),
                           "a cache entry", "")
        if meta.get("schema") != CACHE_SCHEMA or meta.get("key") != key.to_dict():
            return None, f"cached baseline {path} has another key; ignored"
        for sub in (BASELINE, REPEAT):
            run = ProbeRun.load(path / sub)
            if (run.spec.spec_hash(), run.spec.seed_block) != (key.spec_hash, key.seed_block):
                return None, f"cached baseline {path / sub} has another probe spec; ignored"
            if sub == BASELINE and run.drift and not run.null:
                return None, (f"cached baseline {path} has no null model (made before the "
                              "drift verdict was judged against one); measured again")
            arms = sorted({arm for arm, _ in run.null})
            if sub == BASELINE and run.null and arms != sorted(NULL_ARMS):
                return None, (f"cached baseline {path} has the null arms {', '.join(arms)}, "
                              f"not {', '.join(NULL_ARMS)} (an older null model); measured "
                              "again")
    except (OSError, ValueError, ConfigError) as exc:
        return None, f"cached baseline {path} is damaged ({exc}); ignored"
    return CachedBaseline(key, path, str(meta.get("created_at")), meta.get("source_run")), None


def store(key: BaselineKey, arm_dir: Path, repeat_dir: Path) -> Path:
    """Copy a finished baseline into the cache (atomically: a reader never sees half of it)."""
    def fill(tmp: Path) -> dict[str, object]:
        copy_tree(arm_dir, tmp / BASELINE)
        copy_tree(repeat_dir, tmp / REPEAT)
        return {"schema": CACHE_SCHEMA, "key": key.to_dict(), "created_at": now_utc(),
                "source_run": str(arm_dir.parent.resolve())}

    return write_entry(key.dirname, fill)


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_entry(name: str, fill: Callable[[Path], dict[str, object]]) -> Path:
    """The cache entry `name` (under `cache_root`) written by `fill` into a new directory,
    with the `meta.json` it returns, then put in place at once (replacing an older entry)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        meta = fill(tmp)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        final = root / name
        if final.exists():  # a --no-cache run refreshes the entry
            old = root / f".old-{name}-{os.getpid()}"
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, final)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def copy_tree(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True,
                    ignore=lambda _d, names: [n for n in names if n in skip or n.endswith(".tmp")])
