"""One prompt's work as the scheduler holds it (`scheduler.py` runs it, `spec_decode.py` drafts
and verifies for it, `generation.py` builds it)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dsv4bisect.reference.sampling import GREEDY, Sampling

if TYPE_CHECKING:
    import torch

    from dsv4bisect.reference.cache import ModelCache
    from dsv4bisect.reference.engine import TokenScore


@dataclass(eq=False)
class Request:
    """One prompt's work. `score_from`: the first position i whose log p(ids[i] | ids[:i]) is
    wanted (None: none). Filled in by the scheduler; `done` is set when it has left."""

    ids: tuple[int, ...]
    max_new_tokens: int
    stop_ids: frozenset[int]
    top_k: int = 0
    score_from: int | None = None
    sampling: Sampling = GREEDY  # how output tokens are chosen (sampling.py)
    cache: ModelCache | None = None
    filled: int = 0  # prompt tokens in the cache
    cached_tokens: int = 0  # of which the prefix cache gave
    scores: list[TokenScore] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length"
    error: BaseException | None = None
    cancelled: bool = False  # set by the waiting caller; the request leaves at the next step
    rng: torch.Generator | None = None  # its draws (set at admission when it samples)
    resume_logits: torch.Tensor | None = None  # [V]: a whole-prompt hit's first-token logits
    window: Any = None  # its lease on the model's sliding-window store (`Op.WINDOW_STORE`)
    # a PD role keeps the request's decoding state once it has left (reference/pd/): the
    # prefill server transfers it, the decode server writes it back to its state-pool slot
    keep_cache: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    on_token: Callable[[], None] | None = None  # after each output token (a streamed answer)

    def __post_init__(self) -> None:
        if self.max_new_tokens == 0 and self.score_from is None:
            raise ValueError("a request with no new tokens and no scores has no model work")
        if self.score_from is not None and not 1 <= self.score_from < len(self.ids):
            raise ValueError(f"score_from {self.score_from} outside 1..{len(self.ids) - 1}")

    @property
    def target(self) -> int:
        """Prompt tokens to run: all of them when generating; scoring alone needs all but the
        last (the last token predicts nothing that is asked for)."""
        return len(self.ids) - (self.max_new_tokens == 0)

    @property
    def remaining(self) -> int:
        return self.target - self.filled

    @property
    def match_limit(self) -> int:
        """The longest cached prefix it may take: one token at least is computed, and a scored
        position's predicting row is computed too."""
        limit = self.target - 1
        return limit if self.score_from is None else min(limit, self.score_from - 1)
