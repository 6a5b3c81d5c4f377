"""The polluting phase: `ProbeSpec.warmup_requests` requests on the same server before the
measured ones (docs/probe.md, "Requests that come late").

Some state bugs show only once a server has served many requests: a slot of a state pool is
reused after every slot was used once (vllm#52448: 0 % wrong in the first 256 requests, 67 % in
the last bucket; the embedded engine's `stale-slot` fault), a cache evicts, a counter wraps. A
probe that starts on a fresh server never gets there, so before its measured requests it sends N
conversations of its own kind — the probe's generator at another seed, at the tier's shortest
length, every accuracy family in turn — and throws the answers away. They leave the server's
pools and caches holding other conversations' state, which a stale read then shows as a wrong
fact. The standard and deep tiers send 256 by default (the field's onset, and SGLang's decode
pool for DeepSeek-V4: 256 running requests, no pre-allocation above 32); ci and smoke none.
The baseline, its repeat and the candidate send the same requests, at the probe's highest
concurrency level.
"""

from __future__ import annotations

import hashlib
import math
import time

from dsv4bisect.probe.client import ProbeClient, ServerInfo, map_on_clones
from dsv4bisect.probe.grid import DEFAULT_RATIOS, Case, build_cases, periods
from dsv4bisect.probe.layout import calibrate
from dsv4bisect.probe.spec import ACCURACY_FAMILIES, ProbeSpec
from dsv4bisect.probe.vocab import PROBE_VOCAB

MAX_LEVEL = 16  # requests in flight at most (a smoke tier's batch)


def pollution_spec(spec: ProbeSpec) -> ProbeSpec:
    """The spec the polluting conversations are drawn from: another seed (never the measured
    cases), the shortest length, every accuracy family, enough cases per cell for N."""
    families = spec.accuracy_families or ACCURACY_FAMILIES
    cells = len(families) * len(spec.depths) * len(spec.turns)
    key = f"pollute:{spec.seed}:{spec.seed_block}".encode()
    seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1  # < 2**63
    return spec.replace(seed=seed, seed_block=0, families=families,
                        lengths=(min(spec.lengths),), warmup_requests=0, case_share=1.0,
                        cases_per_cell=max(1, math.ceil(spec.warmup_requests / cells)))


def pollution_cases(spec: ProbeSpec, client: ProbeClient, server: ServerInfo) -> list[Case]:
    """The first `spec.warmup_requests` polluting conversations, cells interleaved."""
    source = pollution_spec(spec)
    ratios = periods(server.compress_ratios or DEFAULT_RATIOS, server.sliding_window)
    cases = build_cases(source, PROBE_VOCAB, client.count, calibrate(client.count, PROBE_VOCAB),
                        ratios)
    by_index = sorted(cases, key=lambda c: (c.index, c.cell.key))
    return by_index[: spec.warmup_requests]


def pollute(client: ProbeClient, spec: ProbeSpec, server: ServerInfo) -> dict[str, float]:
    """Send the polluting phase; returns {requests, seconds}."""
    if spec.warmup_requests <= 0:
        return {"requests": 0, "seconds": 0.0}
    t0 = time.perf_counter()
    cases = pollution_cases(spec, client, server)
    level = min(MAX_LEVEL, max(spec.concurrency), len(cases))
    map_on_clones(client, lambda c, case: c.chat(list(case.messages), max_tokens=case.max_tokens),
                  cases, level, spec.timeout_s * level, "probe-pollute")
    return {"requests": len(cases), "seconds": round(time.perf_counter() - t0, 3)}
