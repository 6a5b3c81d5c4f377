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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from dsv4bisect.base.atomic import write_json
from dsv4bisect.base.bounded import load_json
from dsv4bisect.bisect.cluster.archive import pack, unpack
from dsv4bisect.bisect.trials.ends_book import (Settled, end_name, parse_settled, read_settled,
                                                 settled_json)
from dsv4bisect.errors import BisectError, ConfigError
from dsv4bisect.probe.run import ProbeRun

if TYPE_CHECKING:  # the runner that adopts (its `adopt_ends`: none for fresh launches)
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
    on, each end with the node that measured it, and per seed block probed in two looks whose
    bad end is measured, the look that settled it and why (`settled.json`)."""

    good: str  # the good end's configuration fingerprint
    ends: Mapping[str, str]  # end_name -> node
    settled: Mapping[int, Settled] = field(default_factory=dict)  # block -> (look, why)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schema": SCHEMA, "good": self.good,
                               "ends": dict(sorted(self.ends.items()))}
        if self.settled:  # (full ends: the index as before looks)
            doc["settled"] = {str(b): settled_json(s) for b, s in sorted(self.settled.items())}
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
        return cls(str(doc.get("good")), ends, settled)

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
                "good_fingerprint": index.good}
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
                index = EndsIndex(have.good, ends, {**got.settled, **have.settled})
                # the index names only ends fully in place
                write_json(self.root / INDEX, index.to_json())
                return new
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    def pack(self, exclude: Iterable[str] = ()) -> tuple[frozenset[str], bytes | None]:
        """The ends the driver has and `exclude` lacks, as one archive with the settled looks
        of their blocks (None: nothing new). Of a settled block only the ends of its settled
        look go (`EndsIndex.sendable`)."""
        with self._lock:
            index = _read_index(self.root)
            if index is None:
                return frozenset(), None
            skip = set(exclude)
            ends = {n: m for n, m in index.ends.items() if n not in skip and index.sendable(n)}
            if not ends:
                return frozenset(), None
            blocks = {parse_name(n).block for n in ends}
            sent = EndsIndex(index.good, ends,
                             {b: s for b, s in index.settled.items() if b in blocks})
            return frozenset(sent.ends), _archive(self.root, sent)
