"""The candidate cache: a failing `run`'s candidate, kept for the bisect that follows it.

A `run` measures both ends of seed block 0 of the bisect that usually follows it: the good
end's baseline and A/A repeat (the baseline cache, run/baseline.py) and the candidate, which is
the bisect's bad end (all patches: the same configuration, fingerprint and requests). The
candidate's probe run is kept beside the baselines under

    $DSV4BISECT_CACHE/baselines/candidate-<fingerprint>-<spec hash>-b<seed block>/
        meta.json     the key, `"kind": "candidate"`, when and from which run directory, and
                      the identity of the cached baseline it was judged against (`judged_against`:
                      that entry's key, created_at, source_run)
        candidate/    the probe run files (logs/ and receipts/ of its launch)

only where the candidate came from a fresh launch that finished its probe (no crash, its
server verified as its own engine) and its baseline is a cache entry (the one the run reused or
stored). A bisect uses it as its bad end only with that very baseline entry as its good end
(`lookup(..., baseline=)`): a baseline measured again since (`--no-cache`) has another
created_at, and the candidate's comparison with it was never made (docs/bisect.md, "The ends a
failing run already measured").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4bisect.base.bounded import json_object, load_json
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.run import baseline as baseline_cache
from dsv4bisect.run.baseline import (
    BaselineKey,
    CachedBaseline,
    cache_root,
    copy_tree,
    now_utc,
    write_entry,
)

CANDIDATE_SCHEMA = "dsv4bisect.candidate-cache/1"
CANDIDATE = "candidate"


def identity(base: CachedBaseline) -> dict[str, Any]:
    """What names one baseline cache entry: its key and when and from which run it was made
    (a refreshed entry has another `created_at`)."""
    return {"key": base.key.to_dict(), "created_at": base.created_at,
            "source_run": base.source_run}


@dataclass(frozen=True)
class CachedCandidate:
    key: BaselineKey
    path: Path
    created_at: str
    source_run: str | None
    judged_against: dict[str, Any]

    def install(self, run_dir: Path) -> ProbeRun:
        """Copy the cached run (and its launch's logs) into `run_dir`."""
        self.copy(run_dir)
        return ProbeRun.load(run_dir)

    def copy(self, run_dir: Path) -> None:
        """`install`'s files only (the Ray driver ships them as files)."""
        copy_tree(self.path / CANDIDATE, run_dir, skip=("config.json",))


def entry_dir(key: BaselineKey) -> Path:
    return cache_root() / f"{CANDIDATE}-{key.dirname}"


def lookup(key: BaselineKey, baseline: CachedBaseline | None
           ) -> tuple[CachedCandidate | None, str | None]:
    """The cached candidate for `key` judged against `baseline` (the good end's installed
    baseline entry), or (None, why not): none cached (why None), a damaged entry, another
    key, or one judged against another baseline entry (or none installed)."""
    path = entry_dir(key)
    if not (path / "meta.json").exists():
        return None, None
    try:
        meta = json_object(load_json(path / "meta.json", "run"), str(path / "meta.json"),
                           "a cache entry", "")
        if (meta.get("schema"), meta.get("kind"), meta.get("key")) != (
                CANDIDATE_SCHEMA, CANDIDATE, key.to_dict()):
            return None, f"cached candidate {path} has another key; ignored"
        run = ProbeRun.load(path / CANDIDATE)
        if (run.spec.spec_hash(), run.spec.seed_block) != (key.spec_hash, key.seed_block):
            return None, f"cached candidate {path} has another probe spec; ignored"
    except (OSError, ValueError, ConfigError) as exc:
        return None, f"cached candidate {path} is damaged ({exc}); ignored"
    against = meta.get("judged_against")
    if baseline is None or against != identity(baseline):
        made = against.get("created_at") if isinstance(against, dict) else None
        now = f"made {baseline.created_at}" if baseline is not None else "not cached"
        return None, (f"cached candidate {path} was judged against the baseline made {made}, "
                      f"the good end's is {now}: the bad end is probed")
    return CachedCandidate(key, path, str(meta.get("created_at")), meta.get("source_run"),
                           against), None


def run_ends(good_fingerprint: str, bad_fingerprint: str, spec: ProbeSpec
             ) -> tuple[tuple[CachedBaseline, CachedCandidate] | None, str | None]:
    """The ends a failing `run` left for a bisect at the full tier `spec` (seed block 0): the
    good end's baseline entry and the candidate judged against it, or None and why not (None:
    nothing cached)."""
    good, _ = baseline_cache.lookup(BaselineKey.of(good_fingerprint, spec))
    cand, why = lookup(BaselineKey.of(bad_fingerprint, spec), good)
    return ((good, cand) if good is not None and cand is not None else None), why


def store(key: BaselineKey, run_dir: Path, baseline: CachedBaseline) -> Path:
    """Copy a finished candidate's run into the cache, with the identity of the baseline
    entry it was judged against (atomically: a reader never sees half of it)."""
    def fill(tmp: Path) -> dict[str, object]:
        copy_tree(run_dir, tmp / CANDIDATE)
        return {"schema": CANDIDATE_SCHEMA, "kind": CANDIDATE, "key": key.to_dict(),
                "created_at": now_utc(), "source_run": str(run_dir.parent.resolve()),
                "judged_against": identity(baseline)}

    return write_entry(entry_dir(key).name, fill)
