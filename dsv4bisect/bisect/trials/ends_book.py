"""The hot runner's ends book: what a machine knows of the bisect's two ends, by seed block.

Per seed block (`BlockEnds`): the good end's baseline and A/A repeat (measured together here, or
adopted together from another node), the bad end's run, which node each adopted end came from,
and the A/A verdict measured here that no trial has reported yet. Where the ends are probed in
two looks (bisect/end_looks.py), the block also knows which look its runs are of (`look`) and,
once the bad end settled it, why (`settled_by`); its trials use that look's spec. A settled
block writes `settled.json` beside its looks (`b<block>/settled.json`), so a resumed bisect
finds the look whose ends to use. Beside them, the
probes started ahead of the good end's run (probe/ahead.py): per (configuration, seed block),
the accuracy parts sent and the seconds they took, kept for the trial that finishes them.

Ends measured on another node of the same bisect are installed with `adopt` (what
`HotEngineRunner.adopt_ends` calls; the files travel by cluster/shared_ends.py): checked against
this runner's probe spec (of either look), seed block and good end, they serve as if measured
here. So do seed block 0's ends that a failing `run` cached on the Ray driver's machine, sent
with the run they came from (`FromRun`, as `BlockEnds.from_run` where the cache is local).
The ends live as probe-run directories under `ends_dir(trial_dir)`, `b<block>/<end>` (full
ends) or `b<block>/look<k>/<end>` (two looks, each apart).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from dsv4bisect.base.atomic import write_json
from dsv4bisect.base.bounded import load_json
from dsv4bisect.errors import ConfigError
from dsv4bisect.probe.run import ProbeRun
from dsv4bisect.probe.spec import ProbeSpec
from dsv4bisect.run.baseline import CachedBaseline
from dsv4bisect.run.candidate_cache import CachedCandidate

ENDS = ("baseline", "baseline-repeat", "bad")


SETTLED = "settled.json"
Settled = tuple[int, str | None]  # the look that settled a block's ends, and why


def end_name(block: int, end: str, look: int | None = None) -> str:
    """`b<block>/<end>`, or `b<block>/look<look>/<end>` where the ends are probed in looks."""
    return f"b{block}/{end}" if look is None else f"b{block}/look{look}/{end}"


def settled_json(settled: Settled) -> dict[str, Any]:
    """A settled look as `settled.json` and the shared ends' index hold it."""
    look, settled_by = settled
    return {"look": look, "settled_by": settled_by}


def parse_settled(doc: Any) -> Settled | None:
    """`settled_json` read back; None where `doc` names no look (the caller says whose fault)."""
    look = doc.get("look") if isinstance(doc, dict) else None
    if look not in (1, 2):
        return None
    why = doc.get("settled_by")
    return int(look), None if why is None else str(why)


def write_settled(root: Path, block: int, look: int, settled_by: str | None) -> None:
    """Record under `root` (`ends_dir`) which look settled seed block `block`'s ends."""
    write_json(root / f"b{block}" / SETTLED, settled_json((look, settled_by)))


def read_settled(root: Path, block: int) -> Settled | None:
    """The look that settled `block`'s ends and why (`write_settled`); None: not settled."""
    path = root / f"b{block}" / SETTLED
    if not path.is_file():
        return None
    settled = parse_settled(load_json(path, "run"))
    if settled is None:
        raise ConfigError(f"`{path}` names no look of the ends",
                          f"delete `{path.parent}`: its ends are measured again")
    return settled


class RunCache(NamedTuple):
    """The cache entries a failing `run` left for seed block 0 (run/candidate_cache.py
    `run_ends`): the good end's baseline entry, the candidate judged against it (the bad end),
    and the look the block's ends are named by (`end_name`; None: full ends)."""

    good: CachedBaseline
    bad: CachedCandidate
    look: int | None


@dataclass(frozen=True)
class FromRun:
    """The failing `run` whose cached ends a seed block's are (end_probes.py `run_ends`): its
    run directory and when its baseline entry and its candidate were made. Plain values: they
    travel with the ends to the Ray executor's nodes (cluster/shared_ends.py)."""

    source_run: str | None
    baseline_made: str
    bad_made: str

    @classmethod
    def of(cls, run: RunCache) -> FromRun:
        return cls(run.bad.source_run, run.good.created_at, run.bad.created_at)

    def describe(self) -> str:
        return f"{self.source_run}: baseline made {self.baseline_made}, bad end {self.bad_made}"

    def to_json(self) -> dict[str, Any]:
        return {"source_run": self.source_run, "baseline_made": self.baseline_made,
                "bad_made": self.bad_made}

    @classmethod
    def from_json(cls, doc: Any) -> FromRun | None:
        """`to_json` read back; None where `doc` is not one (the caller says whose fault)."""
        if not isinstance(doc, dict) or not {"baseline_made", "bad_made"} <= set(doc):
            return None
        source = doc.get("source_run")
        return cls(None if source is None else str(source), str(doc["baseline_made"]),
                   str(doc["bad_made"]))


def ends_dir(trial_dir: Path) -> Path:
    """Where the trials of `trial_dir`'s bisect keep the ends (`b<block>/<end>`)."""
    return trial_dir.parent.parent / "ends"


@dataclass
class BlockEnds:
    """One seed block's ends as a hot runner knows them. A bad end adopted before the block's
    good end is known waits here; the block is usable once its baseline is there."""

    baseline: ProbeRun | None = None
    repeat: ProbeRun | None = None
    bad: ProbeRun | None = None
    came_from: dict[str, str] = field(default_factory=dict)  # adopted end (ENDS) -> its node
    aa: tuple[str, ...] = ()  # the A/A verdict measured here that no trial reported yet
    look: int = 1  # the look the runs above are of (1 until the bad end asks for the full tier)
    settled_by: str | None = None  # end_looks.settles' reason where look 1 settled the ends
    # the ends a failing `run` measured (seed block 0, full tier; bisect/trials/end_probes.py
    # `run_ends`, or adopted from the Ray driver, which found them in its cache): the baseline
    # entry installed as the good end, the candidate as the bad end
    from_run: FromRun | None = None

    @property
    def known(self) -> bool:
        """The good end measured (or adopted): trials of this block can be judged."""
        return self.baseline is not None

    def adopted(self, end: str) -> bool:
        return end in self.came_from


# A probe started ahead of the good end's run: its shards' accuracy parts, the seconds it took
Ahead = tuple[list[ProbeRun], dict[str, float]]


class EndsBook:
    """Every seed block's `BlockEnds`, the adoption of ends measured on another node, and the
    probes started ahead of the good end's run."""

    def __init__(self) -> None:
        self.blocks: dict[int, BlockEnds] = {}
        self._ahead: dict[tuple[str, int], Ahead] = {}

    def block(self, block: int) -> BlockEnds:
        return self.blocks.setdefault(block, BlockEnds())

    def take_aa(self, block: int) -> tuple[str, ...]:
        """The A/A verdict of `block` measured here, once: the trial that reports it."""
        ends = self.block(block)
        aa, ends.aa = ends.aa, ()
        return aa

    def keep_ahead(self, key: tuple[str, int], started: Ahead | None) -> None:
        """The probe of configuration `key[0]` at seed block `key[1]` started ahead (None: it
        could not start; an earlier one of the same trial is forgotten either way)."""
        self._ahead.pop(key, None)
        if started is not None:
            self._ahead[key] = started

    def take_ahead(self, key: tuple[str, int]) -> Ahead | None:
        return self._ahead.pop(key, None)

    def has_ahead(self, key: tuple[str, int]) -> bool:
        return key in self._ahead

    def adopt(self, block: int, base: ProbeRun | None, repeat: ProbeRun | None,
              bad: ProbeRun | None, *, looks: Mapping[int, ProbeSpec], good: str,
              good_fingerprint: str, source: str, look: int | None = None,
              settled: Settled | None = None, from_run: FromRun | None = None) -> list[str]:
        """Install ends of seed block `block` measured by `source` (another node of this
        bisect); returns the ends installed (`end_name`). Ends already here are kept (its own
        measurement, or an earlier adoption). The good end's baseline and A/A repeat come as
        a pair. `looks`: the spec of each look of the block's ends (one entry with full ends);
        `look`: the look the runs are of, as their names say (`b<block>/look<k>/<end>`; None:
        full ends' names, `b<block>/<end>`, whose spec names the look); a bad end is installed
        with the good end's pair of its own look. `settled`: the look that settled the block
        and why, where the node that probed its bad end said so (`settled.json`): a block not
        settled here takes that look, its trials that look's spec, and a good end of the other
        look measured here gives way to the settled one (it is never judged against again).
        `from_run`: the ends are the ones a failing `run` cached (sent by the Ray driver,
        cluster/shared_ends.py); once the block's baseline and bad end are both these, its bad
        end's trial judges the cached run as where the cache is local (`BlockEnds.from_run`).
        A run of another probe spec, seed block, good end (`good`: this runner's) or look is a
        ConfigError naming `source`."""
        if (base is None) != (repeat is None):
            raise ConfigError(f"the ends of seed block {block} from {source} hold the good "
                              "end's baseline without its A/A repeat (or the reverse)",
                              "send both runs of the good end, or neither")
        if good_fingerprint != good:
            raise ConfigError(f"the ends of seed block {block} from {source} were measured on "
                              f"good end {good_fingerprint[:12]}, this runner's is {good[:12]}",
                              "every node must resolve the same good end as the driver")
        look_of = _looks_of(block, {"baseline": base, "baseline-repeat": repeat, "bad": bad},
                            looks, look, source)
        if base is not None and look_of["baseline"] != look_of["baseline-repeat"]:
            raise ConfigError(f"the good end of seed block {block} from {source} holds runs of "
                              "two looks", "send the baseline and A/A repeat of one look")
        other = [k for k in look_of.values() if settled is not None and k != settled[0]]
        if settled is not None and other:
            raise ConfigError(f"the ends of seed block {block} from {source} are of look "
                              f"{other[0]}, the block settled at look {settled[0]}",
                              "send the ends of the look that settled the block")
        ends = self.block(block)
        if settled is not None and ends.bad is None:  # settled elsewhere, not here
            if ends.known and ends.look != settled[0]:
                ends.baseline = ends.repeat = None  # of a look the block's trials never use
                for end in ENDS[:2]:
                    ends.came_from.pop(end, None)
            ends.look, ends.settled_by = settled
        installed: list[str] = []
        if not ends.known and base is not None:
            ends.baseline, ends.repeat = base, repeat
            ends.look = look_of["baseline"]
            installed += ["baseline", "baseline-repeat"]
        if bad is not None and ends.bad is None:  # before the good end is known: waits here
            if ends.known and look_of["bad"] != ends.look:
                raise ConfigError(f"the bad end of seed block {block} from {source} is of look "
                                  f"{look_of['bad']}, this runner's good end of look {ends.look}",
                                  "send the good end's runs of the bad end's look with it")
            ends.bad = bad
            ends.look = look_of["bad"]
            installed.append("bad")
        ends.came_from.update({end: source for end in installed})
        if from_run is not None and ends.came_from.get("baseline") == source == \
                ends.came_from.get("bad"):
            ends.from_run = from_run
        return [end_name(block, end, look) for end in installed]


def _looks_of(block: int, runs: Mapping[str, ProbeRun | None], looks: Mapping[int, ProbeSpec],
              look: int | None, source: str) -> dict[str, int]:
    """The look of each adopted run of `block` (end -> look): the one its name says (`look`),
    whose spec it must be, else the one its spec is. A spec that is both looks (full ends; a
    tier whose look 1 keeps every case) is look 1, as a block measured here starts: the first
    look of a hash names it."""
    want: dict[str, int] = {}
    for k, s in sorted(looks.items()):
        if look is None or k == look:
            want.setdefault(s.replace(seed_block=block).spec_hash(), k)
    if not want:
        raise ConfigError(f"the ends of seed block {block} from {source} are named look "
                          f"{look}, this runner probes looks {sorted(looks)}",
                          "every node must run the driver's dsv4bisect and probe tier")
    look_of: dict[str, int] = {}
    for end, run in runs.items():
        if run is None:
            continue
        if run.spec.seed_block != block or run.spec.spec_hash() not in want:
            named = "" if look is None else f" look {look}"
            raise ConfigError(f"the {end} of seed block {block}{named} from {source} is a probe "
                              f"of seed block {run.spec.seed_block}, spec "
                              f"{run.spec.spec_hash()} (this runner probes spec "
                              f"{' or '.join(sorted(want))})",
                              "every node must run the driver's dsv4bisect and probe tier")
        look_of[end] = want[run.spec.spec_hash()]
    return look_of
