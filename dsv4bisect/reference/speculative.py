"""MTP speculative decoding: the verification rule, the cache commit and the metrics.

The settings (SGLang's `--speculative-*` arguments) are in `spec_settings.py`.

One round of a request (`spec_decode.py` runs it for the whole decode batch): the MTP layer drafts
`num_steps` tokens one after the other (each step reads its previous step's output streams and
the token it drafted, as SGLang's EAGLE chain does), the main model runs the last emitted token
and the drafts in one forward, `verify` keeps the longest acceptable prefix and the token the
main model chooses after it. The forward ran on a fork of the request's cache; `commit_rows`
advances the pre-round cache by exactly the rows of the emitted tokens, so a rejected draft
leaves no K=V row, compressor window, compressed entry or indexer key behind.

Metrics as SGLang's scheduler reports them (`managers/scheduler_components/metrics_reporter.py`):
`spec_accept_rate` = accepted drafts / proposed drafts, `avg_spec_accept_length` = tokens
emitted per verify forward (accepted drafts + the main model's own token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dsv4bisect.reference.cache import ModelCache
from dsv4bisect.reference.sampling import draw

# ---- verification -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One request's round: `tokens` chosen at verify rows 0..len-1 (the accepted drafts, then
    the main model's token at the first rejected row or after the last draft); `accepted` of
    them are drafts."""

    tokens: list[int]
    accepted: int


def verify(drafts: list[int], choose: Any, probs: torch.Tensor | None = None,
           generator: torch.Generator | None = None) -> Verdict:
    """Accept a prefix of `drafts` against the main model's rows.

    Greedy (`probs` None): draft i is accepted when it is `choose(i)`, the main model's token at
    row i (argmax). Sampling (`probs` [len(drafts) + 1, V], the target distribution after
    temperature / top-k / top-p): the draft is a point mass (top-1 chain), so the standard
    rejection rule accepts draft i with probability p_i(draft) and otherwise samples row i from
    p_i with the draft removed (max(p - q, 0) renormalised); after the last accepted draft the
    next row is sampled from p (`choose`). The tokens are then distributed exactly as sampling
    from the main model alone."""
    out: list[int] = []
    for i, d in enumerate(drafts):
        if probs is None:
            token = choose(i)
            out.append(token)
            if token != d:
                return Verdict(out, i)
            continue
        u = float(torch.rand((), generator=generator, device=probs.device))
        if u < float(probs[i, d]):
            out.append(d)
            continue
        residual = probs[i].clone()
        residual[d] = 0.0
        total = float(residual.sum())
        token = (int(torch.multinomial(residual / total, 1, generator=generator))
                 if total > 0 else choose(i))
        out.append(token)
        return Verdict(out, i)
    out.append(choose(len(drafts)))
    return Verdict(out, len(drafts))


class Verification:
    """Speculative verification as SGLang's EAGLE verify does it (`Op.SPEC_VERIFY`, stock): a
    greedy request's drafts against the main model's argmax, a sampled one's by rejection
    sampling from its own distribution. Called with the request, its drafts and its verify
    rows' logits [1 + k, V]."""

    def __call__(self, r: Any, drafts: list[int], rows: torch.Tensor) -> Verdict:
        if r.sampling.greedy:
            return self.greedy(drafts, rows)
        probs = r.sampling.probs(rows)
        return verify(drafts, lambda i: draw(probs[i], r.rng), probs, r.rng)

    def greedy(self, drafts: list[int], rows: torch.Tensor) -> Verdict:
        return verify(drafts, lambda i: int(torch.argmax(rows[i])))


# ---- the cache commit ---------------------------------------------------------------------------


def commit_rows(model: Any, cache: ModelCache, trace: dict[int, Any], n: int) -> None:
    """Advance `cache` — the state a traced `forward_ragged` started from — by that forward's
    first `n` rows, as if only they had run: per attention layer the K=V rows join the window,
    and the compressors' (and the indexer's) projections go through the same pooling
    (`Compressor.absorb`) a forward runs, so the entries equal those of a forward of n rows."""
    start = cache.n_tokens
    step = model._step(torch.zeros(n, dtype=torch.int64, device=model.embed.weight.device), start)
    window_len = model.a.sliding_window - 1
    for i, block in enumerate(model.layers):
        kv, proj = trace[i]  # kv [1, T, D]; proj[site][name] [1, T, ...]
        lc = cache.layers[i]
        window = torch.cat((lc.window, kv[0, :n]))
        keep = min(window_len, window.shape[0])
        lc.window, lc.window_start = window[window.shape[0] - keep :].clone(), start + n - keep
        attn = block.attn
        if attn.compressor is not None:
            attn.compressor.absorb(proj["comp"]["kv"][:, :n], proj["comp"]["score"][:, :n],
                                   step, [lc.comp])
        if attn.indexer is not None:
            attn.indexer.compressor.absorb(proj["index"]["kv"][:, :n],
                                           proj["index"]["score"][:, :n], step, [lc.index])
    cache.n_tokens = start + n


def spec_metrics(totals: dict[str, int]) -> dict[str, float | None]:
    """SGLang's speculative metrics and main-model forwards per output token from the
    scheduler's counters (None before there is anything to divide)."""
    def ratio(a: str, b: str) -> float | None:
        return round(totals[a] / totals[b], 4) if totals.get(b) else None

    return {"spec_accept_rate": ratio("spec_accepted_drafts", "spec_proposed_drafts"),
            "avg_spec_accept_length": ratio("spec_emitted_tokens", "spec_verify_forwards"),
            "main_forwards_per_output_token": ratio("main_forwards", "output_tokens")}
