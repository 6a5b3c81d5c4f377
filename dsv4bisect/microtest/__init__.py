"""`dsv4bisect microtest`: each patch's op against its fp32 reference on real checkpoint tensors.

Torch-free entry points (importable by the CLI at parse time): `spec` (what to run), `results`
(rows, report, exit code), `markdown` (the `microtest.md` rendering), `runners` (SGLang's MoE
scaling and clamp logic as data), `tolerances`. The numerics (`run.run_microtest` and the
`check_*` modules) import torch and are imported only when a run starts. See docs/microtest.md.
"""

from __future__ import annotations
