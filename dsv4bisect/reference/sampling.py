"""Sampling of the embedded engine, with SGLang's request parameters (`temperature`, `top_p`,
`top_k`, `sampling_seed`).

SGLang's sampler (`srt/layers/sampler.py`, `top_k_top_p_min_p_sampling_from_probs_torch`): the
logits divided by the temperature, softmax, then the top-k then the top-p truncation (the
smallest set of the most likely tokens whose mass reaches p; the token that crosses it is kept),
renormalised, one draw. Temperature 0 (or top-k 1) is greedy: the argmax, ties to the lowest id.
A request's draws come from its own generator seeded with `sampling_seed` (SGLang's per-request
seed), so a seeded request samples the same tokens alone or in any batch; without a seed each
request gets a fresh random one. The reported log-probs stay the model's (before temperature
and truncation), as SGLang reports them by default.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0): every token
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    def generator(self, device: torch.device) -> torch.Generator:
        seed = random.getrandbits(63) if self.seed is None else self.seed
        return torch.Generator(device=device).manual_seed(seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [..., V] -> the distribution a draw is made from [..., V] (not for greedy)."""
        p = torch.softmax(logits.float() / self.temperature, -1)
        if 0 < self.top_k < p.shape[-1]:
            kth = torch.topk(p, self.top_k, -1).values[..., -1:]
            p = torch.where(p >= kth, p, 0.0)
        if self.top_p < 1:
            sorted_p, order = torch.sort(p, dim=-1, descending=True, stable=True)
            before = torch.cumsum(sorted_p, -1) - sorted_p  # mass of the better tokens
            sorted_p = torch.where(before < self.top_p * sorted_p.sum(-1, keepdim=True),
                                   sorted_p, 0.0)
            p = torch.zeros_like(p).scatter(-1, order, sorted_p)
        return p / p.sum(-1, keepdim=True)


GREEDY = Sampling()


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a distribution [V]."""
    return int(torch.multinomial(probs, 1, generator=generator))
