"""The probe grid: cells (family × length × depth × turns), seeds, jitter, and the cases.

Determinism: a case's seed is a hash of (spec seed, seed block, family, cell, index); its content
and layout come from `random.Random(seed)` and the server's token counts only. The same spec and
block against the same tokenizer give byte-identical requests.

Jitter: DeepSeek-V4 compresses the KV cache in blocks (`compress_ratios`: 4 and 128 on Flash, 4
and 16 on the embedded tiny preset) and attends to a sliding window (`sliding_window`: 128 on
Flash, 32 on the shipped tiny checkpoint); both come from the server's `/server_info`
(`periods`). A known bug lived only at prompt length ≡ 3 (mod 4) (vllm#55927), others at the
compression boundary and past the window (mlx-lm PR #1189, field-bugs notes). So each cell's cases step the target length one token at a time around a multiple
of the block (the lcm of the periods): offsets 0, -1, -2, +1 cover every residue mod 4 and the last two and first
two positions of a compression block; further offsets do the same around the middle of a block.

A look of a bisect's ends (`ProbeSpec.case_share` below 1, bisect/end_looks.py) builds only part
of the accuracy cases (`kept_case_ids`): per (family, length) stratum `cases_kept(n, share)` of
its n cases, drawn by a shuffle seeded by (seed, seed block, family, length), and every drift
transcript. A kept case is the full tier's case byte for byte (its seed and jitter offset do not
depend on the share), so both ends of a look get the same cases and each look-1 case is a case of
the full tier.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsv4bisect.probe.formats import Content, copy_content, needle_content, vartrack_content
from dsv4bisect.probe.layout import Calibration, Counter, Message, layout
from dsv4bisect.probe.spec import ProbeSpec, cases_kept
from dsv4bisect.probe.vocab import Vocabulary

DEFAULT_RATIOS = (4, 128)  # DeepSeek-V4 Flash/Pro, when the server does not report its ratios
DEFAULT_WINDOW = 128  # DeepSeek-V4 Flash/Pro's sliding window, when the server does not say


def periods(ratios: Sequence[int] | None, window: int | None) -> tuple[int, ...]:
    """The token periods the grid's lengths step around: the compression ratios and the sliding
    window the server reports (DeepSeek-V4's when it does not). On SGLang (4, 128, window 128)
    the block is 128; on the embedded tiny model (4, 16, window 32) it is 32, so a window edge
    and every compression block edge fall on the jitter's anchors."""
    return (*(ratios or DEFAULT_RATIOS), window or DEFAULT_WINDOW)


@dataclass(frozen=True)
class Cell:
    family: str
    length: int  # nominal
    depth: float
    turns: int

    @property
    def key(self) -> str:
        return f"{self.family}/L{self.length}/d{self.depth:g}/t{self.turns}"


@dataclass(frozen=True)
class Case:
    """One conversation: the exact request content and what a correct answer is."""

    case_id: str
    cell: Cell
    index: int
    seed: int
    target: int  # nominal length moved by the jitter offset
    messages: tuple[Message, ...]
    prompt_tokens: int  # measured on the server that built the case
    expected: str
    values: tuple[str, ...]
    needle_depth: float
    max_tokens: int  # generation budget for the answer
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def family(self) -> str:
        return self.cell.family

    def to_dict(self) -> dict[str, Any]:
        return {"case_id": self.case_id, "family": self.cell.family, "length": self.cell.length,
                "depth": self.cell.depth, "turns": self.cell.turns, "index": self.index,
                "seed": self.seed, "target": self.target, "prompt_tokens": self.prompt_tokens,
                "expected": self.expected, "values": list(self.values),
                "needle_depth": self.needle_depth, "max_tokens": self.max_tokens,
                "meta": self.meta,
                "messages": [dict(m) for m in self.messages]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Case:
        cell = Cell(d["family"], int(d["length"]), float(d["depth"]), int(d["turns"]))
        return cls(d["case_id"], cell, int(d["index"]), int(d["seed"]), int(d["target"]),
                   tuple({"role": m["role"], "content": m["content"]} for m in d["messages"]),
                   int(d["prompt_tokens"]), d["expected"], tuple(d["values"]),
                   float(d["needle_depth"]), int(d["max_tokens"]), dict(d.get("meta", {})))


def block_size(ratios: Sequence[int]) -> int:
    """The least common multiple of the compression ratios above 1."""
    useful = sorted({int(r) for r in ratios if int(r) > 1}) or list(DEFAULT_RATIOS)
    return math.lcm(*useful)


def jitter_offsets(ratios: Sequence[int], n: int) -> list[int]:
    """n one-token offsets: around a block boundary first, then around block middles."""
    block = block_size(ratios)
    anchors = [0, block // 2, block // 4, 3 * block // 4]
    out: list[int] = []
    for a in anchors:
        for d in (0, -1, -2, 1):
            if a + d not in out:
                out.append(a + d)
    return out[:n]


def base_length(nominal: int, ratios: Sequence[int]) -> int:
    """The nominal length moved to a block multiple (a multiple of 4 when blocks are too big)."""
    block = block_size(ratios)
    unit = block if nominal >= 4 * block else 4
    return max(unit, round(nominal / unit) * unit)


def answer_budget(expected: str, per_char: float, cap: int) -> int:
    """Tokens to generate for an answer: its length plus room for eos (byte-level tokenizers,
    where the tiny model answers bare) or for a short sentence around it (BPE: a token is at
    least one character, so len(expected) + 8 tokens always cover the value)."""
    slack = 2 if per_char >= 0.9 else 8
    return min(cap, len(expected) + slack)


def case_seed(spec: ProbeSpec, cell: Cell, index: int) -> int:
    text = f"{spec.seed}:{spec.seed_block}:{cell.key}:{index}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def cells(spec: ProbeSpec, lengths: Sequence[int] | None = None) -> list[tuple[Cell, int]]:
    """Every (cell, cases in it), in request order; drift cells cycle the depths."""
    lengths = spec.lengths if lengths is None else lengths
    out: list[tuple[Cell, int]] = []
    for fam in spec.accuracy_families:
        out += [(Cell(fam, n, d, t), spec.cases_per_cell)
                for n in lengths for d in spec.depths for t in spec.turns]
    if "drift" in spec.families and spec.drift_cases:
        for n in lengths:
            for i in range(spec.drift_cases):
                out.append((Cell("drift", n, spec.depths[i % len(spec.depths)], spec.turns[0]), 1))
    return out


def kept_case_ids(spec: ProbeSpec) -> frozenset[str] | None:
    """The accuracy case ids a look at `spec.case_share` keeps (None: every case, share 1),
    over the spec's whole grid (a length the server cannot hold drops its stratum whole, the
    draw of the others stays). Drift cases are never dropped and are not listed."""
    if spec.case_share >= 1.0:
        return None
    strata: dict[tuple[str, int], list[str]] = {}
    for cell, n in cells(spec):
        if cell.family != "drift":
            strata.setdefault((cell.family, cell.length), []).extend(
                f"{cell.key}/{i}" for i in range(n))
    kept: set[str] = set()
    for (family, length), ids in strata.items():
        key = f"share:{spec.seed}:{spec.seed_block}:{family}:{length}"
        order = list(ids)
        random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
                      ).shuffle(order)
        kept.update(order[: cases_kept(len(ids), spec.case_share)])
    return frozenset(kept)


def answer_conditions(spec: ProbeSpec, family: str) -> list[tuple[str, int]]:
    """The (arm, concurrency level) each accuracy case of `family` is answered under: the
    spec's conditions the arm takes, then the thinking arm (needle cases only, level 1)."""
    conditions = list(spec.conditions()) + ([("think", 1)] if spec.thinking else [])
    return [(arm, level) for arm, level in conditions
            if spec.arm_takes(arm, family) and (arm != "think" or family == "needle")]


def accuracy_answers(spec: ProbeSpec) -> int:
    """The paired accuracy answers of a probe of `spec` at its `case_share`: each kept case
    (`cases_kept` of its stratum) once per condition it is answered under. It does not depend
    on the seed: every draw of a stratum keeps the same count."""
    strata: dict[tuple[str, int], int] = {}
    for cell, n in cells(spec):
        if cell.family != "drift":
            strata[cell.family, cell.length] = strata.get((cell.family, cell.length), 0) + n
    return sum(cases_kept(n, spec.case_share) * len(answer_conditions(spec, family))
               for (family, _), n in strata.items())


def _content(spec: ProbeSpec, vocab: Vocabulary, cell: Cell, rng: random.Random) -> Content:
    if cell.family in ("needle", "drift"):
        return needle_content(rng, vocab, cell.depth, distractors=spec.distractors,
                              queries=spec.queries if cell.family == "needle" else 1)
    if cell.family == "copy":
        return copy_content(rng, vocab, cell.depth, distractors=spec.distractors,
                            chars=spec.copy_chars)
    return vartrack_content(rng, vocab, cell.depth, hops=spec.hops)


def build_cases(spec: ProbeSpec, vocab: Vocabulary, count: Counter, calib: Calibration,
                ratios: Sequence[int], *, lengths: Sequence[int] | None = None,
                on_case: Callable[[int, int], None] | None = None) -> list[Case]:
    """All cases of `spec` (or of its cells at `lengths`), at exact lengths by `count`; at a
    `case_share` below 1 only the kept ones (`kept_case_ids`), in the same order."""
    offsets = jitter_offsets(ratios, spec.jitter)
    plan = cells(spec, lengths)
    rotation = {cell: k for k, (cell, _) in enumerate(cells(spec))}  # stable under `lengths`
    kept = kept_case_ids(spec)
    chosen = [(cell, i) for cell, n in plan for i in range(n)
              if kept is None or cell.family == "drift" or f"{cell.key}/{i}" in kept]
    total = len(chosen)
    cases: list[Case] = []
    for cell, i in chosen:
        seed = case_seed(spec, cell, i)
        rng = random.Random(seed)
        content = _content(spec, vocab, cell, rng)
        target = base_length(cell.length, ratios) + offsets[(i + rotation[cell]) % len(offsets)]
        lay = layout(content, turns=cell.turns, target=target, rng=rng, vocab=vocab,
                     calib=calib, count=count)
        budget = answer_budget(content.expected, calib.per_char, spec.max_tokens)
        cases.append(Case(f"{cell.key}/{i}", cell, i, seed, target, lay.messages,
                          lay.prompt_tokens, content.expected, content.values,
                          lay.needle_depth, budget, {**content.meta, "pad": lay.pad}))
        if on_case:
            on_case(len(cases), total)
    return cases
