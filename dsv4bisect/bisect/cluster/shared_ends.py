"""The ends of a bisect whose trials run on several nodes: measured once, used by every node.

A hot runner measures a seed block's ends as its trials need them (bisect/trials/hot_runner.py): the
good end's baseline and A/A repeat, and the bad end's full-size run, each a probe-run directory
under its `ends/b<block>/{baseline,baseline-repeat,bad}`. On the Ray executor those ends travel
as files (docs/cluster.md, "The ends travel"):

* the node packs the ends its trial measured into one archive beside the trial's
  (`pack_ends`: the probe-run files plus an index naming the good end and the node);
* the driver keeps them in its run directory, `ends/b<block>/<end>/` with `ends/index.json`
  (`DriverEnds.keep`; the first copy of an end that comes back is the one kept);
* every later trial request carries the ends the driver has and that node does not
  (`DriverEnds.pack`), and the node installs them in its runner before the trial
  (`adopt`: `HotEngineRunner.adopt_ends`, which checks probe spec, seed block and good end).

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsv4bisect.base.atomic import write_json
from dsv4bisect.base.bounded import load_json
from dsv4bisect.bisect.cluster.archive import pack, unpack
from dsv4bisect.bisect.trials.ends_book import end_name
from dsv4bisect.errors import BisectError, ConfigError
from dsv4bisect.probe.run import ProbeRun

if TYPE_CHECKING:  # the runner that adopts (its `adopt_ends`: none for fresh launches)
    from dsv4bisect.bisect.trials.engine_runner import EngineRunner

INDEX = "index.json"
SCHEMA = "dsv4bisect.shared-ends/1"
_NAME = re.compile(r"^b(\d+)/(baseline|baseline-repeat|bad)$")


def parse_name(name: str) -> tuple[int, str]:
    """`b<block>/<end>` as (block, end); anything else is a node's or an edit's fault."""
    m = _NAME.match(name)
    if m is None:
        raise BisectError(f"`{name}` is not an end of a seed block (b<block>/<end>)",
                          "the nodes must run the same dsv4bisect as the driver")
    return int(m.group(1)), m.group(2)


@dataclass(frozen=True)
class EndsIndex:
    """What an ends archive (or the driver's ends folder) holds: the good end it was measured
    on, and each end with the node that measured it."""

    good: str  # the good end's configuration fingerprint
    ends: Mapping[str, str]  # b<block>/<end> -> node

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "good": self.good, "ends": dict(sorted(self.ends.items()))}

    @classmethod
    def from_json(cls, doc: Any) -> EndsIndex:
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise BisectError("an ends index of another format",
                              "the nodes must run the same dsv4bisect as the driver")
        ends = {str(k): str(v) for k, v in dict(doc.get("ends") or {}).items()}
        for name in ends:
            parse_name(name)
        return cls(str(doc.get("good")), ends)


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
    """The ends `names` a node measured under `ends_dir`, as one archive; None when there is
    none to send."""
    names = sorted({n for n in names if (ends_dir / n / "run.json").is_file()})
    if not names:
        return None
    return _archive(ends_dir, EndsIndex(good, {n: node for n in names}))


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
    point at them) and install them in `runner` (`adopt_ends`), per seed block the good end's
    pair first, then the bad end. Returns the ends the runner installed."""
    index = unpack_ends(data, directory)
    by_block: dict[int, dict[str, str]] = {}
    for name, node in index.ends.items():
        block, end = parse_name(name)
        by_block.setdefault(block, {})[end] = node
    installed: list[str] = []
    for block, ends in sorted(by_block.items()):
        runs = {end: ProbeRun.load(directory / end_name(block, end)) for end in ends}
        if "baseline" in ends or "baseline-repeat" in ends:
            installed += runner.adopt_ends(
                block, runs.get("baseline"), runs.get("baseline-repeat"), None,
                good_fingerprint=index.good, source=ends.get("baseline") or ends["baseline-repeat"])
        if "bad" in ends:
            installed += runner.adopt_ends(block, None, None, runs["bad"],
                                           good_fingerprint=index.good, source=ends["bad"])
    return installed


class DriverEnds:
    """The driver's copy of the ends, in `<run dir>/ends/` (so a resume has them)."""

    def __init__(self, run_dir: Path) -> None:
        self.root = run_dir / "ends"
        self._lock = threading.Lock()

    def index(self) -> EndsIndex | None:
        with self._lock:
            return _read_index(self.root)

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
                if have.good != got.good:
                    raise BisectError(f"a node sent ends measured on good end {got.good[:12]}, "
                                      f"the bisect's are on {have.good[:12]}",
                                      "every node must resolve the same good end as the driver")
                new = sorted(n for n in got.ends if n not in have.ends)
                for name in new:
                    (self.root / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.rmtree(self.root / name, ignore_errors=True)  # a half-kept copy
                    shutil.move(str(tmp / name), str(self.root / name))
                ends = {**have.ends, **{n: got.ends[n] for n in new}}
                index = EndsIndex(have.good, ends)
                # the index names only ends fully in place
                write_json(self.root / INDEX, index.to_json())
                return new
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    def pack(self, exclude: Iterable[str] = ()) -> tuple[frozenset[str], bytes | None]:
        """The ends the driver has and `exclude` lacks, as one archive (None: nothing new)."""
        with self._lock:
            index = _read_index(self.root)
            if index is None:
                return frozenset(), None
            skip = set(exclude)
            sent = EndsIndex(index.good, {n: m for n, m in index.ends.items() if n not in skip})
            if not sent.ends:
                return frozenset(), None
            return frozenset(sent.ends), _archive(self.root, sent)
