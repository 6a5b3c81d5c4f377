"""The ends of a bisect whose trials run on several nodes: measured once, used by every node.

A hot runner measures a seed block's ends as its trials need them (bisect/trials/hot_runner.py): the
good end's baseline and A/A repeat, and the bad end's run, each a probe-run directory under its
`ends/`: `b<block>/{baseline,baseline-repeat,bad}` with full ends, `b<block>/look<k>/<end>`
where the ends are probed in two looks (bisect/end_looks.py), with `b<block>/settled.json`, the
look that settled the block, written by the trial that probed its bad end. On the Ray executor
those ends travel as files (docs/cluster.md, "The ends travel"):

* the node packs the ends its trial measured into one archive beside the trial's
  (`pack_ends`: the probe-run files plus an index naming the good end, the node, and the
  settled look of each block whose ends it sends);
* the driver keeps them in its run directory, `ends/<name>/` with `ends/index.json`
  (`DriverEnds.keep`; the first copy of an end, and of a block's settled look, that comes
  back is the one kept);
* the ends a failing `run` cached for seed block 0 where the driver's cache has them (the
  lookup a hot runner makes, `EngineRunner.run_cache`: the good end's baseline entry and the
  candidate judged against it, at the full tier) are kept as that block's settled ends before
  the first trial request (`DriverEnds.keep_run`; the index says which `run`, `from_run`), so
  every node judges block 0 by them, as a local bisect does, with no node's cache needed;
* every later trial request carries the ends the driver has and that node does not, of a
  settled block only those of its settled look, with the settled looks (`DriverEnds.pack`),
  and the node installs them in its runner before the trial (`adopt`:
  `HotEngineRunner.adopt_ends`, which checks probe spec, look, seed block and good end, and
  makes a settled block's trials use its settled look: no node probes look 1 again, or judges
  against ends of the other look).

No Ray here (bisect/cluster/ray_executor.py carries the bytes); only files, never probe objects, go
through Ray's object store. A hot runner keeps the ends it knows in its ends book
(trials/ends_book.py), whose `EndsBook.adopt` is what `adopt` installs; the driver's copy is
`DriverEnds`, the ends book of the Ray runner.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from dsv4bisect.base.atomic import write_json
from dsv4bisect.base.bounded import load_json
from dsv4bisect.bisect.cluster.archive import pack, unpack
from dsv4bisect.bisect.trials.ends_book import (
    ENDS,
    FromRun,
    RunCache,
    Settled,
    end_name,
    parse_settled,
    read_settled,
    settled_json,
)
from dsv4bisect.errors import BisectError, ConfigError, Dsv4BisectError
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.run.events import Notice

if TYPE_CHECKING:  # the runner that adopts (its `adopt_ends`: none for fresh launches), and
    # the driver's, which looks up a run's cache (`run_cache`)
    from dsv4bisect.bisect.trials.engine_runner import EngineRunner

INDEX = "index.json"
SCHEMA = "dsv4bisect.shared-ends/1"
_NAME = re.compile(r"^b(\d+)/(?:look([12])/)?(baseline|baseline-repeat|bad)$")


class EndName(NamedTuple):
    """An end's name on the wire: `b<block>/<end>`, or `b<block>/look<look>/<end>`."""

    block: int
    end: str
    look: int | None


def parse_name(name: str) -> EndName:
    """An end's name (`end_name`) parsed; anything else is a node's or an edit's fault."""
    m = _NAME.match(name)
    if m is None:
        raise BisectError(f"`{name}` is not an end of a seed block (b<block>/<end> or "
                          "b<block>/look<k>/<end>)",
                          "the nodes must run the same dsv4bisect as the driver")
    return EndName(int(m.group(1)), m.group(3), int(m.group(2)) if m.group(2) else None)


@dataclass(frozen=True)
class EndsIndex:
    """What an ends archive (or the driver's ends folder) holds: the good end it was measured
    on, each end with the node that measured it, per seed block probed in two looks whose
    bad end is measured, the look that settled it and why (`settled.json`), and per seed block
    whose ends a failing `run` cached, that run (`from_run`)."""

    good: str  # the good end's configuration fingerprint
    ends: Mapping[str, str]  # end_name -> node (or `run <dir>`)
    settled: Mapping[int, Settled] = field(default_factory=dict)  # block -> (look, why)
    from_run: Mapping[int, FromRun] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schema": SCHEMA, "good": self.good,
                               "ends": dict(sorted(self.ends.items()))}
        if self.settled:  # (full ends: the index as before looks)
            doc["settled"] = {str(b): settled_json(s) for b, s in sorted(self.settled.items())}
        if self.from_run:
            doc["from_run"] = {str(b): r.to_json() for b, r in sorted(self.from_run.items())}
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> EndsIndex:
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise BisectError("an ends index of another format",
                              "the nodes must run the same dsv4bisect as the driver")
        ends = {str(k): str(v) for k, v in dict(doc.get("ends") or {}).items()}
        for name in ends:
            parse_name(name)
        settled: dict[int, Settled] = {}
        for block, looked in dict(doc.get("settled") or {}).items():
            one = parse_settled(looked)
            if not str(block).isdigit() or one is None:
                raise BisectError(f"an ends index whose block `{block}` settled at no look",
                                  "the nodes must run the same dsv4bisect as the driver")
            settled[int(block)] = one
        from_run: dict[int, FromRun] = {}
        for block, run in dict(doc.get("from_run") or {}).items():
            got = FromRun.from_json(run)
            if not str(block).isdigit() or got is None:
                raise BisectError(f"an ends index whose block `{block}` names no run",
                                  "the nodes must run the same dsv4bisect as the driver")
            from_run[int(block)] = got
        return cls(str(doc.get("good")), ends, settled, from_run)

    def has_block(self, block: int) -> bool:
        return any(parse_name(n).block == block for n in self.ends)

    def blocks(self, names: Iterable[str]) -> EndsIndex:
        """This index with only `names`' ends, and the settled looks and runs of their
        blocks."""
        ends = {n: self.ends[n] for n in names}
        blocks = {parse_name(n).block for n in ends}
        return EndsIndex(self.good, ends,
                         {b: s for b, s in self.settled.items() if b in blocks},
                         {b: r for b, r in self.from_run.items() if b in blocks})

    def sendable(self, name: str) -> bool:
        """Whether `name` is an end a node may judge with: of a block not settled yet, or of
        the look that settled it (the other look's ends are never used again)."""
        block, _end, look = parse_name(name)
        return look is None or self.settled.get(block, (look, None))[0] == look


def _read_index(root: Path) -> EndsIndex | None:
    path = root / INDEX
    if not path.is_file():
        return None
    try:
        doc = load_json(path, "run")  # the bounded loader, as for every file the tool reads
    except ConfigError as exc:
        raise BisectError(f"`{path}` cannot be read ({exc.message})",
                          "delete the run directory's ends/ folder: its trials measure them "
                          "again") from None
    return EndsIndex.from_json(doc)


def _archive(root: Path, index: EndsIndex) -> bytes:
    """One archive of the ends `index` names under `root` (each `b<block>/<end>/`, the
    probe-run files) with that index."""
    with tempfile.TemporaryDirectory(prefix="ends-") as tmp:
        out = Path(tmp)
        for name in sorted(index.ends):
            parse_name(name)
            shutil.copytree(root / name, out / name)
        (out / INDEX).write_text(json.dumps(index.to_json()) + "\n")
        return pack(out)


def pack_ends(ends_dir: Path, names: Iterable[str], *, good: str, node: str) -> bytes | None:
    """The ends `names` a node measured under `ends_dir`, as one archive, with the settled
    look of their blocks (`settled.json`, where the node wrote one); None when there is none
    to send."""
    names = sorted({n for n in names if (ends_dir / n / "run.json").is_file()})
    if not names:
        return None
    blocks = {parse_name(n).block for n in names}
    settled = {b: s for b in sorted(blocks) if (s := read_settled(ends_dir, b)) is not None}
    return _archive(ends_dir, EndsIndex(good, {n: node for n in names}, settled))


def unpack_ends(data: bytes, directory: Path) -> EndsIndex:
    """Unpack `pack_ends`' archive into `directory`; its index."""
    unpack(data, directory)
    index = _read_index(directory)
    if index is None:
        raise BisectError("an ends archive without its index",
                          "the nodes must run the same dsv4bisect as the driver")
    return index


def adopt(runner: EngineRunner, data: bytes, directory: Path) -> list[str]:
    """On a node: unpack the driver's ends into `directory` (kept: a verdict's evidence may
    point at them) and install them in `runner` (`adopt_ends`), per seed block and look the
    good end's pair first, then the bad end, each with the block's settled look. Returns the
    ends the runner installed."""
    index = unpack_ends(data, directory)
    by_look: dict[tuple[int, int | None], dict[str, str]] = {}
    for name, node in index.ends.items():
        block, end, look = parse_name(name)
        by_look.setdefault((block, look), {})[end] = node
    installed: list[str] = []
    for (block, look), ends in sorted(by_look.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        runs = {end: ProbeRun.load(directory / end_name(block, end, look)) for end in ends}
        both = {"look": look, "settled": index.settled.get(block),
                "good_fingerprint": index.good, "from_run": index.from_run.get(block)}
        if "baseline" in ends or "baseline-repeat" in ends:
            installed += runner.adopt_ends(
                block, runs.get("baseline"), runs.get("baseline-repeat"), None,
                source=ends.get("baseline") or ends["baseline-repeat"], **both)
        if "bad" in ends:
            installed += runner.adopt_ends(block, None, None, runs["bad"], source=ends["bad"],
                                           **both)
    return installed


class DriverEnds:
    """The driver's copy of the ends, in `<run dir>/ends/` (so a resume has them)."""

    def __init__(self, run_dir: Path) -> None:
        self.root = run_dir / "ends"
        self._lock = threading.Lock()

    def index(self) -> EndsIndex | None:
        with self._lock:
            return _read_index(self.root)

    def has_block(self, block: int) -> bool:
        """Whether the driver has any end of seed block `block`."""
        index = self.index()
        return index is not None and index.has_block(block)

    def from_run(self, block: int) -> FromRun | None:
        """The failing `run` whose cached ends are seed block `block`'s (`keep_run`), if any:
        its trials of the ends probe nothing (no replica to switch, nothing to start ahead)."""
        index = self.index()
        return index.from_run.get(block) if index is not None else None

    def keep(self, data: bytes | None) -> list[str]:
        """Keep the ends of a node's archive that the driver does not have yet; returns them.
        Another good end than the ends kept so far is an error (one bisect, one good end)."""
        if not data:
            return []
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".in-", dir=self.root))
            try:
                got = unpack_ends(data, tmp)
                have = _read_index(self.root) or EndsIndex(got.good, {})
                _same_good(have, got.good, "a node sent ends")
                new = sorted(n for n in got.ends if n not in have.ends)
                self._move_in(tmp, new)
                ends = {**have.ends, **{n: got.ends[n] for n in new}}
                # the index names only ends fully in place
                self._write(replace(have, ends=ends, settled={**got.settled, **have.settled}))
                return new
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    def keep_run(self, good: str, run: RunCache) -> list[str]:
        """Keep seed block 0's ends from the cache a failing `run` left (`run`: the driver's
        lookup, `EngineRunner.run_cache`; `good`: the good end's fingerprint): the baseline
        entry's pair and the candidate, named by their look and settled at it, as a local
        hot runner installs them (`EndProbes.run_ends`), with the run they came from. Kept
        before the first trial request, so every node has them with its first trial. Nothing
        where the driver has an end of block 0 already (a resumed bisect's). Returns the ends
        kept; a cache entry that cannot be copied raises (OSError, ConfigError)."""
        names = [end_name(0, end, run.look) for end in ENDS]
        with self._lock:
            have = _read_index(self.root) or EndsIndex(good, {})
            _same_good(have, good, "the run's cache holds ends")
            if have.has_block(0):
                return []
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".run-", dir=self.root))
            try:
                if not run.good.copy(tmp / names[0], tmp / names[1]):
                    raise ConfigError(f"cached baseline {run.good.path} has no A/A repeat",
                                      "run `dsv4bisect run` again with --no-cache")
                run.bad.copy(tmp / names[2])
                self._move_in(tmp, names)
                from_run = FromRun.of(run)
                settled = {0: (run.look, None)} if run.look is not None else {}
                self._write(replace(
                    have, ends={**have.ends, **dict.fromkeys(names, f"run {from_run.source_run}")},
                    settled={**have.settled, **settled}, from_run={**have.from_run, 0: from_run}))
                return names
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    def pack(self, exclude: Iterable[str] = ()) -> tuple[frozenset[str], bytes | None]:
        """The ends the driver has and `exclude` lacks, as one archive with the settled looks
        (and the runs) of their blocks (None: nothing new). Of a settled block only the ends
        of its settled look go (`EndsIndex.sendable`)."""
        with self._lock:
            index = _read_index(self.root)
            if index is None:
                return frozenset(), None
            skip = set(exclude)
            names = [n for n in index.ends if n not in skip and index.sendable(n)]
            if not names:
                return frozenset(), None
            sent = index.blocks(names)
            return frozenset(sent.ends), _archive(self.root, sent)

    def _move_in(self, tmp: Path, names: Iterable[str]) -> None:
        for name in names:
            (self.root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(self.root / name, ignore_errors=True)  # a half-kept copy
            shutil.move(str(tmp / name), str(self.root / name))

    def _write(self, index: EndsIndex) -> None:
        write_json(self.root / INDEX, index.to_json())


def seed_run_ends(ends: DriverEnds, runner: EngineRunner) -> list[str]:
    """The Ray driver's seed block 0 ends from the cache a failing `run` left on its machine:
    the lookup `runner` (the driver's own runner) makes before block 0's first trial
    (`run_cache`: hot runners, unless --no-cache), kept in `ends` (`keep_run`) before the first
    trial request. A refused entry (a candidate of another baseline, a damaged entry: the
    lookup's warning) or one that cannot be copied: a warning, and the nodes measure block 0's
    ends as before. Nothing where `ends` has block 0's already (a resume). Returns the ends
    kept."""
    if ends.has_block(0):
        return []
    run = runner.run_cache()
    if run is None:
        return []
    try:
        kept = ends.keep_run(runner.good_cfg.fingerprint, run)
    except (OSError, Dsv4BisectError) as exc:
        runner.on_event(Notice(f"seed block 0's ends cached by a run are not sent to the nodes "
                               f"({exc}): they are measured", "warn"))
        return []
    if kept:
        runner.on_event(Notice(f"seed block 0's ends are the ones a run measured "
                               f"({FromRun.of(run).describe()}): every node is sent them with "
                               "its first trial, no request is sent for them; --no-cache "
                               "measures them again"))
    return kept


def _same_good(have: EndsIndex, good: str, what: str) -> None:
    """One bisect, one good end: ends of another are an error."""
    if have.good != good:
        raise BisectError(f"{what} measured on good end {good[:12]}, the bisect's are on "
                          f"{have.good[:12]}",
                          "every node must resolve the same good end as the driver")
