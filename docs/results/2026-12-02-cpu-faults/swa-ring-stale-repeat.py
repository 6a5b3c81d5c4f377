"""mma-decode:swa-ring-stale on a prompt sent again after it was cached (the ATOM#1417 repro's
shape), shipped checkpoint at `precision: deployment`, driven through the scheduler (no server):
a 300-token prompt, then the same prompt plus 80 tokens scored (its prompt is cached), then that
prompt again with 8 greedy tokens, which resumes from the cached 379 tokens.

    PYTHONPATH=. python docs/results/2026-12-02-cpu-faults/swa-ring-stale-repeat.py
"""

import torch

from dsv4bisect.reference.engine import ReferenceEngine
from dsv4bisect.reference.prefix_cache import PrefixCache
from dsv4bisect.reference.scheduler import Request, Scheduler

g = torch.Generator().manual_seed(3)
p1 = tuple(torch.randint(3, 250, (300,), generator=g).tolist())
tail = tuple(torch.randint(3, 250, (80,), generator=g).tolist())
for variant in ("split-k", "swa-ring-stale"):
    engine = ReferenceEngine.load("dsv4bisect/reference/weights",
                                  patches={"mma-decode": variant}, device="cpu")
    sched = Scheduler(engine, prefix_cache=PrefixCache(), background=False)
    for r in (Request(p1, 1, frozenset()),
              Request(p1 + tail, 0, frozenset(), score_from=len(p1)),
              last := Request(p1 + tail, 8, frozenset())):
        sched.submit(r)
        while sched.step():
            pass
    print(variant, "cached", last.cached_tokens, "output", last.output_ids)
