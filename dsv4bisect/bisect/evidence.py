"""Noise evidence a finished bisect leaves in the ledger for later bisects to measure rates.

End checks count when the bisect established that the ends differ (the good end truly passes,
the bad end truly fails); re-tested configurations count once the culprit set is known (it says
which of them truly fail). Trials reused from another bisect were counted there. Only full-size
probes count: a sequential trial probe states its own error rates (and BETWEEN is no outcome
of the full probe), so its verdicts say nothing about the full probe's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from dsv4bisect.bisect.ledger import Ledger, StepRow
from dsv4bisect.bisect.search.results import SearchResult, Status
from dsv4bisect.probe import verdict as V


def record_noise_evidence(
    ledger: Ledger,
    probe: str,
    run_id: str,
    candidates: Sequence[str],
    result: SearchResult,
    steps: Sequence[StepRow],
) -> int:
    """Add the evidence of one finished bisect; returns how many rows were added."""
    everything = frozenset(candidates)
    counts = Counter(s.subset for s in steps)
    added = 0
    for s in steps:
        if V.FROM_SEARCH_WORD[s.outcome] in (V.CANNOT_TEST, V.BETWEEN) or s.trial_id is None:
            continue
        if s.subset in (frozenset(), everything):
            truth, source = ("fail" if s.subset else "pass"), "end"
        elif result.status is Status.FOUND and result.culprits and counts[s.subset] > 1:
            truth, source = ("fail" if result.culprits <= s.subset else "pass"), "retest"
        else:
            continue
        row = ledger.trial(s.trial_id)
        if row.run_id != run_id or row.details.get("error_rates"):
            continue
        ledger.add_noise_evidence(
            probe,
            source,
            truth,
            s.outcome,
            fingerprint=row.key.fingerprint,
            run_id=run_id,
            trial_id=row.id,
        )
        added += 1
    return added
