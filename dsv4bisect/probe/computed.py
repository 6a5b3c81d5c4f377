"""What a probe's requests leave the engine to compute: prompt tokens the prefix cache did not
supply, per arm (pure; docs/probe.md, "What the engine computes").

A request's cost on a prefill-bound server is its uncached prompt tokens, not its nominal
prompt length. Per arm (`runner.chat_row`), measured on the embedded engine's scheduler counter
`prefill_tokens_computed` and the rows' `cached_tokens` (tests/probe/test_computed_tokens_e2e.py):

* **cold** — the whole prompt: a cache flush first at level 1; at a higher level only what
  every conversation shares is cached (the chat template's first tokens, nothing on the
  embedded engine, whose cache keeps a state snapshot only where a prompt ended).
* **warm** — the whole conversation too. The replay's `max_tokens=1` requests each compute
  their new turn and the scored request the last one; the turns add up to the prompt (the
  smoke tier's 1,022-token cases: 1,022 computed, 980 of the scored request's prompt cached).
  The arm exercises the cache; it skips no prefill, so it costs what a cold request costs.
* **hit** — after its case's cold request at the same level, both sends are whole hits:
  SGLang recomputes the last token of each (its radix match is cut back by one token to
  produce logits), the embedded engine none (a snapshot keeps the logits). Elsewhere its
  first send computes the prompt.
* **drift** — the transcript scored once, every token.

A run's rows say the same where the server reports `cached_tokens` (`row_computed`): a cold or
hit row computes what its scored request did not find cached (a hit twice: its first send saw
the same cache); a warm row its whole prompt (what the scored request found cached, the replay
computed). A server that does not report it is counted by the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

SGLANG_RECOMPUTED = 1  # tokens SGLang recomputes of a whole-prompt hit, per request
HIT_SENDS = 2  # a hit request is sent twice (max_tokens=1, then scored)


def request_computed(arm: str, prompt_tokens: int, *, after_cold: bool = True,
                     recomputed: int = SGLANG_RECOMPUTED) -> int:
    """Prompt tokens one accuracy case computes under `arm` (its replay or retry included).
    `after_cold`: the case's cold request ran just before at the same level (a hit's first
    send is then a hit too); `recomputed`: what the engine recomputes of a whole hit (SGLang
    1, the embedded engine 0)."""
    if arm == "hit":
        first = recomputed if after_cold else prompt_tokens
        return first + recomputed * (HIT_SENDS - 1)
    return prompt_tokens  # cold, warm (the replay's turns add up to the prompt), think, drift


def row_computed(row: Mapping[str, Any]) -> int:
    """What one row of a run computed, from its own `cached_tokens` where the server said."""
    prompt = int(row.get("prompt_tokens") or 0)
    cached = row.get("cached_tokens")
    arm = row.get("arm")
    if arm in ("warm", "drift") or cached is None:
        return request_computed(str(arm), prompt)
    fresh = max(prompt - int(cached), 0)
    return fresh * HIT_SENDS if arm == "hit" else fresh


def run_computed(rows: Iterable[Mapping[str, Any]]) -> int:
    """The prompt tokens a run's requests computed (`row_computed` summed)."""
    return sum(row_computed(r) for r in rows)
