"""The probe specification: what to ask, at which lengths and depths, how often, and how.

A `ProbeSpec` is a frozen value with a canonical JSON form; `spec_hash()` identifies what is
measured in every run directory, verdict and ledger entry. The seed block is left out of the
hash: a ledger keys trials by (configuration fingerprint, spec hash, seed block), and a re-test
draws a fresh block of the same spec. Same spec + same block + same server tokenizer → the same
requests, byte for byte. `PROBE_VERSION` is part of the hash: bump it on any change of prompts,
formats, vocabulary or scoring, so cached baselines from an older probe are never reused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from dsv4bisect.errors import ConfigError, did_you_mean

PROBE_VERSION = 2  # 2: a value glued to more characters is not correct

ACCURACY_FAMILIES = ("needle", "copy", "vartrack")
FAMILIES = (*ACCURACY_FAMILIES, "drift")
ARMS = ("cold", "warm", "hit")
ARM_PLANS = ("every", "staggered")
MAX_CONCURRENCY = 1 << 16
MAX_WARMUP = 1 << 16
# the polluting phase of the long tiers (probe/warmup.py): the field's onset (vllm#52448: none
# of the first 256 requests wrong) and SGLang's DeepSeek-V4 decode pool (256 running requests)
LATE_REQUESTS = 256
TIER_NAMES = ("ci", "smoke", "standard", "deep")


def cases_kept(n: int, share: float) -> int:
    """How many of a (family, length) stratum's `n` accuracy cases a probe at `case_share`
    `share` keeps: at least one of a non-empty stratum, all at share 1."""
    return n if share >= 1.0 else min(n, max(1, math.ceil(share * n)))


@dataclass(frozen=True)
class ProbeSpec:
    """Everything that decides the probe's requests and scoring (all lengths in server tokens)."""

    tier: str
    families: tuple[str, ...]
    lengths: tuple[int, ...]  # nominal prompt lengths; jitter moves each case by a few tokens
    depths: tuple[float, ...]  # needle position as a fraction of the prompt's tokens
    turns: tuple[int, ...]  # user turns before the question (each with an assistant "OK.")
    cases_per_cell: int
    seed: int = 0
    seed_block: int = 0  # a re-test of a configuration draws a fresh block
    jitter: int = 4  # one-token length offsets cycled per cell (4 covers every residue mod 4)
    max_tokens: int = 96  # cap on generated tokens; each request asks len(answer) + slack
    distractors: int = 3  # other facts of the same type
    queries: int = 1  # needle keys asked in the final question (>1: multi-query)
    copy_chars: tuple[int, int] = (24, 48)  # planted string length range for `copy`
    hops: int = 2  # variable-tracking chain length (assignments after the first)
    drift_cases: int = 1  # teacher-forced transcripts per length
    drift_top_k: int = 8
    drift_window: int = 4096  # score at most the last N tokens of each transcript
    arms: tuple[str, ...] = ("cold",)
    # Requests in flight at once: every accuracy case runs at each level (docs/probe.md
    # "Conditions"); at a level above 1 the submission order is a shuffle fixed by the seed.
    concurrency: tuple[int, ...] = (1,)
    # Which arm a case takes at which level: `every` arm at every level, or `staggered`: the
    # first arm at the lowest level, the others at the higher levels in turn (one level: all).
    arm_plan: str = "every"
    # The families the hit arm asks (empty: every accuracy family). Its cost is the answers'
    # decoding, and a stale restored state shows from the second generated token on, so the
    # families with short answers suffice (docs/probe.md, "The hit arm").
    hit_families: tuple[str, ...] = ()
    thinking: bool = False  # also run needle cases with thinking on (when the server has it)
    thinking_max_tokens: int = 1024
    timeout_s: float = 120.0  # per request
    retries: int = 2  # on connection errors and 5xx, with exponential backoff
    # The polluting phase (probe/warmup.py): this many requests of other conversations on the
    # same server before the measured ones, so that state bugs that start late (a pool's slots
    # all used once) are provoked
    warmup_requests: int = 0
    # A look of a bisect's ends (bisect/end_looks.py): this share of each (family, length)
    # stratum's accuracy cases (`cases_kept`), every drift transcript. 1: the whole tier.
    case_share: float = 1.0
    notes: str = field(default="", compare=False)  # free text, not part of the hash

    def __post_init__(self) -> None:
        _validate(self)

    def canonical(self) -> dict[str, Any]:
        """The hashed form: every field but `notes` and `seed_block`, plus PROBE_VERSION. The
        serving conditions are left out at their defaults (one level, every arm), so a spec
        that asks for none keeps the hash it had before they existed."""
        data = dataclasses.asdict(self)
        data.pop("notes")
        data.pop("seed_block")
        if tuple(data["concurrency"]) == (1,):
            data.pop("concurrency")
        if data["arm_plan"] == "every":
            data.pop("arm_plan")
        if not data["hit_families"]:
            data.pop("hit_families")
        if not data["warmup_requests"]:
            data.pop("warmup_requests")
        if data["case_share"] == 1.0:
            data.pop("case_share")
        data["probe_version"] = PROBE_VERSION
        return data

    def canonical_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))

    def spec_hash(self) -> str:
        """16 hex digits of sha256 over the canonical JSON (the seed block is not in it)."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "probe_version": PROBE_VERSION}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProbeSpec:
        """Rebuild a saved spec; a spec from another probe version is refused."""
        version = data.get("probe_version", PROBE_VERSION)
        if version != PROBE_VERSION:
            raise ConfigError(
                f"probe spec was written by probe version {version}; this is version "
                f"{PROBE_VERSION}",
                "collect the baseline again with this version of dsv4bisect",
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known - {"probe_version"})
        if unknown:
            raise ConfigError(f"unknown probe spec keys: {', '.join(unknown)}",
                              "was this spec written by another dsv4bisect version?")
        kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in known}
        return cls(**kwargs)

    def replace(self, **changes: Any) -> ProbeSpec:
        return dataclasses.replace(self, **changes)

    @property
    def accuracy_families(self) -> tuple[str, ...]:
        return tuple(f for f in self.families if f in ACCURACY_FAMILIES)

    def arms_at(self, level: int) -> tuple[str, ...]:
        """The arms every accuracy case runs at concurrency `level` (one of `concurrency`).
        Staggered: arm k at the k-th level, wrapping around to the lowest when there are more
        arms than levels (cold, warm, hit over 1, 16: cold and hit at 1, warm at 16); a level
        past the last arm repeats the arms after the first in turn."""
        if self.arm_plan == "every" or len(self.concurrency) == 1 or len(self.arms) == 1:
            return self.arms
        index = self.concurrency.index(level)
        if index >= len(self.arms):
            rest = self.arms[1:]
            return (rest[(index - 1) % len(rest)],)
        return tuple(a for k, a in enumerate(self.arms) if k % len(self.concurrency) == index)

    def arm_takes(self, arm: str, family: str) -> bool:
        """Whether `arm` asks the cases of `family` (the hit arm only `hit_families`')."""
        return arm != "hit" or not self.hit_families or family in self.hit_families

    def conditions(self) -> tuple[tuple[str, int], ...]:
        """Every (arm, concurrency) an accuracy case runs under, in the order they run."""
        return tuple((arm, level) for level in self.concurrency for arm in self.arms_at(level))


def _validate(spec: ProbeSpec) -> None:
    def bad(message: str, hint: str | None = None) -> ConfigError:
        return ConfigError(f"probe spec: {message}", hint)

    for fam in spec.families:
        if fam not in FAMILIES:
            guess = did_you_mean(fam, FAMILIES)
            raise bad(f"unknown family `{fam}`", f"{guess + ' ' if guess else ''}families: "
                      f"{', '.join(FAMILIES)}")
    if not spec.families or len(set(spec.families)) != len(spec.families):
        raise bad("families must be a non-empty list without repeats")
    if not spec.lengths or any(n < 64 for n in spec.lengths):
        raise bad("lengths must be a non-empty list of token counts >= 64")
    if not spec.depths or any(not 0.0 <= d <= 1.0 for d in spec.depths):
        raise bad("depths must be fractions in [0, 1]")
    if not spec.turns or any(t < 1 for t in spec.turns):
        raise bad("turns must be positive")
    for arm in spec.arms:
        if arm not in ARMS:
            raise bad(f"unknown arm `{arm}`", f"arms: {', '.join(ARMS)}")
    checks = [
        (spec.cases_per_cell >= 1, "cases_per_cell must be >= 1"),
        (1 <= spec.jitter <= 16, "jitter must be in 1..16"),
        (spec.max_tokens >= 8, "max_tokens must be >= 8"),
        (spec.distractors >= 0, "distractors must be >= 0"),
        (1 <= spec.queries <= 1 + spec.distractors, "queries must be in 1..1+distractors"),
        (8 <= spec.copy_chars[0] <= spec.copy_chars[1] <= 256,
         "copy_chars must be 8 <= lo <= hi <= 256"),
        (1 <= spec.hops <= 8, "hops must be in 1..8"),
        (spec.drift_cases >= 0, "drift_cases must be >= 0"),
        (1 <= spec.drift_top_k <= 20, "drift_top_k must be in 1..20"),
        (spec.drift_window >= 16, "drift_window must be >= 16"),
        (spec.timeout_s > 0 and spec.retries >= 0, "timeout_s must be > 0 and retries >= 0"),
        (bool(spec.arms), "arms must not be empty"),
        (bool(spec.concurrency) and all(1 <= c <= MAX_CONCURRENCY for c in spec.concurrency)
         and all(a < b for a, b in zip(spec.concurrency, spec.concurrency[1:])),
         f"concurrency must be increasing levels in 1..{MAX_CONCURRENCY} without repeats"),
        (spec.arm_plan in ARM_PLANS, f"arm_plan must be one of {', '.join(ARM_PLANS)}"),
        (set(spec.hit_families) <= set(ACCURACY_FAMILIES),
         f"hit_families must be among {', '.join(ACCURACY_FAMILIES)}"),
        (0 <= spec.warmup_requests <= MAX_WARMUP,
         f"warmup_requests must be in 0..{MAX_WARMUP}"),
        (0.0 < spec.case_share <= 1.0, "case_share must be in (0, 1]"),
    ]
    for ok, message in checks:
        if not ok:
            raise bad(message)


_TIERS: dict[str, ProbeSpec] = {
    # Seconds on the embedded engine: used by the tests; no power worth stating.
    "ci": ProbeSpec(tier="ci", families=("needle", "copy", "drift"), lengths=(256, 1024),
                    depths=(0.5,), turns=(2,), cases_per_cell=1, distractors=1,
                    copy_chars=(24, 24), drift_cases=1, drift_top_k=5, max_tokens=48,
                    timeout_s=60.0),
    # The default on the embedded engine. Its cases are all multi-turn: cold at the lowest
    # concurrency level, the needle and vartrack ones each followed by the same request sent
    # again (hit: a retry served whole from the prefix cache), warm (turn-by-turn replay:
    # prefix-cache hits) at the others.
    "smoke": ProbeSpec(tier="smoke", families=("needle", "copy", "vartrack", "drift"),
                       lengths=(256, 512, 1024, 2048), depths=(0.1, 0.5, 0.9), turns=(3,),
                       cases_per_cell=1, distractors=1, copy_chars=(24, 28), drift_cases=1,
                       max_tokens=64, timeout_s=60.0, arms=("cold", "warm", "hit"),
                       arm_plan="staggered", concurrency=(1, 16),
                       hit_families=("needle", "vartrack")),
    # A real deployment, ~1k requests per level; arms as in smoke; the polluting phase first.
    "standard": ProbeSpec(tier="standard", families=("needle", "copy", "vartrack", "drift"),
                          lengths=(4096, 16384, 32768, 65536),
                          depths=(0.02, 0.1, 0.25, 0.5, 0.75, 0.9), turns=(8, 32),
                          cases_per_cell=7, drift_cases=4, drift_top_k=20, drift_window=2048,
                          copy_chars=(32, 64), timeout_s=600.0, arms=("cold", "warm"),
                          arm_plan="staggered", concurrency=(1, 16),
                          warmup_requests=LATE_REQUESTS),
    # Everything: long lengths, warm arm, thinking arm, more jitter.
    "deep": ProbeSpec(tier="deep", families=("needle", "copy", "vartrack", "drift"),
                      lengths=(8192, 16384, 32768, 65536, 131072),
                      depths=(0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98), turns=(1, 8, 32, 128),
                      cases_per_cell=8, jitter=8, distractors=8, queries=2, copy_chars=(32, 64),
                      hops=4, drift_cases=8, drift_top_k=20, drift_window=2048,
                      arms=("cold", "warm"), thinking=True, timeout_s=900.0,
                      warmup_requests=LATE_REQUESTS),
}


# The tests' tier runs at one level whatever a profile lists, so that the many runs of the test
# suite keep their cost; every other tier takes the profile's levels (`with_concurrency`).
SINGLE_LEVEL_TIERS = ("ci",)


def with_concurrency(spec: ProbeSpec, levels: tuple[int, ...] | None) -> ProbeSpec:
    """`spec` at the concurrency levels a profile asks for (None: the tier's own)."""
    if levels is None or spec.tier in SINGLE_LEVEL_TIERS:
        return spec
    return spec.replace(concurrency=tuple(levels))


def tier_spec(tier: str, *, families: tuple[str, ...] | None = None, seed: int | None = None,
              seed_block: int | None = None) -> ProbeSpec:
    """The preset for `tier`, optionally narrowed to `families` or moved to another seed block."""
    if tier not in _TIERS:
        guess = did_you_mean(tier, TIER_NAMES)
        raise ConfigError(f"unknown probe tier `{tier}`",
                          f"{guess + ' ' if guess else ''}tiers: {', '.join(TIER_NAMES)}")
    spec = _TIERS[tier]
    changes: dict[str, Any] = {}
    if families is not None:
        changes["families"] = tuple(families)
    if seed is not None:
        changes["seed"] = seed
    if seed_block is not None:
        changes["seed_block"] = seed_block
    return spec.replace(**changes) if changes else spec
