"""Which probe a trial gets: the probing policy both trial runners share (pure).

The hot runner (bisect/trials/hot_runner.py) asks it what to probe in a trial, and the Ray
runner (bisect/cluster/ray_executor.py) which trials to shard and which bad end starts ahead of
the good end's run; the two decide by the same rules (docs/hot-switching.md, docs/cluster.md):

* the ends (the good end ∅ and the bad end, as the search names them) are probed at full size:
  the good end's baseline and A/A repeat first, in a fresh launch, and its trial is then the ∅
  end check (the A/A verdict, nothing probed again);
* any other configuration gets the sequential trial probe against the two ends once the bad
  end of its seed block is measured (`policy.sequential`), a full probe before;
* a sequential trial's re-test (seed block > 0) draws other requests, in another order, against
  the first block's ends; an end's re-test probes its own block at full size;
* only the ends' probes are split across idle nodes, each look of the trial's own
  configuration where the ends are probed in two looks (bisect/end_looks.py; the look-2 good
  end measured in the bad end's trial runs whole on its node: docs/cluster.md, "Sharding with
  looks"); a sequential trial probe, a few percent of a full one, is shorter than the switch a
  replica pays (bisect/rounds.py);
* in a round with the good end of seed block b, the bad end of block b beside it starts its
  probe ahead of the good end's run (probe/ahead.py) unless the ends run alone; with the
  trials beside the ends (`BESIDE`), so does every other trial of that round. Such a trial
  comes before its block's bad end is known, so it is probed at the block's look like an end
  (a full probe of look 1's cases: trials/end_probes.py `ends_for`) and judged against the
  good end's run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from dsv4bisect.bisect.rounds import ALONE, BESIDE
from dsv4bisect.policy import DEFAULT_POLICY, TrialPolicy


class Probe(Enum):
    """What one trial probes."""

    AA_CHECK = "the good end's A/A verdict"  # its baseline and repeat were just measured fresh
    FULL = "a full-size probe"
    SEQUENTIAL = "the sequential trial probe"


@dataclass(frozen=True)
class ProbingPolicy:
    """The probing rules for one bisect: its two ends' patch sets and its trial policy (hot
    engines that share their ends; the sequential trial probe between the ends)."""

    good: Mapping[str, str] = field(default_factory=dict)
    bad: Mapping[str, str] = field(default_factory=dict)
    policy: TrialPolicy = DEFAULT_POLICY

    def is_good(self, patches: Mapping[str, str]) -> bool:
        return dict(patches) == dict(self.good)

    def is_bad(self, patches: Mapping[str, str]) -> bool:
        return dict(patches) == dict(self.bad)

    def is_end(self, patches: Mapping[str, str]) -> bool:
        return self.is_good(patches) or self.is_bad(patches)

    def seed_block(self, patches: Mapping[str, str], block: int, first_bad_known: bool) -> int:
        """The seed block whose ends judge a trial of `patches` at `block` (`first_bad_known`:
        seed block 0's bad end is measured)."""
        reuse = self.policy.sequential and not self.is_end(patches) and first_bad_known
        return 0 if reuse else block

    def probe(self, patches: Mapping[str, str], *, good_end_fresh: bool, bad_known: bool,
              confirmation: bool, ahead: bool = False) -> Probe:
        """What a trial of `patches` probes: `good_end_fresh`, its block's good end was just
        measured in a fresh launch (here, or on the node it was adopted from); `bad_known`, its
        block's bad end is measured; `confirmation`, the fresh launch that confirms culprits;
        `ahead`, its probe started ahead of the good end's run (`starts_ahead`: a trial beside
        the ends started it at the block's look before the bad end was known, and finishes it
        so, whether or not the bad end came back first)."""
        if self.is_good(patches) and good_end_fresh and not confirmation:
            return Probe.AA_CHECK
        if bad_known and not ahead and not self.is_bad(patches) and self.policy.sequential:
            return Probe.SEQUENTIAL
        return Probe.FULL

    def starts_ahead(self, patches: Mapping[str, str], block: int, good_block: int | None,
                     schedule: str | None) -> bool:
        """Whether a trial of `patches` at `block` is the bad end beside the good end of its
        block (`good_block`: the good end's seed block in the round, if any), or with
        `BESIDE` any other trial of that round, whose probe starts ahead of the good end's run:
        hot runners only (they share their ends), and not where the ends run alone
        (`schedule`, bisect/rounds.py)."""
        beside = self.is_bad(patches) or (schedule == BESIDE and not self.is_good(patches))
        return self.policy.hot and schedule != ALONE and good_block == block and beside
