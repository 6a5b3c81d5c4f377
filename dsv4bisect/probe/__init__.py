"""The long-context coherence probe: seeded multi-turn families, paired statistics, verdicts.

Modules, in pipeline order (docs/probe.md explains the whole):

- `spec`: `ProbeSpec`, `PROBE_VERSION`, tier presets (`tier_spec`).
- `vocab`, `formats`: vocabularies and the conversation formats (shared with training data).
- `layout`, `grid`: exact lengths in the server's tokens, jitter, seeds, the cases.
- `client`: the HTTP calls (SGLang and the embedded server alike).
- `scoring`, `drift`: one answer's score and signatures; teacher-forced drift metrics.
- `run`, `runner`: `ProbeRun` (save/load) and `collect` / `judge`.
- `stats`, `power`, `verdict`, `judge`: exact tests, tier power, the `Verdict` and its rule.
- `session`: baseline (live or saved) + A/A + candidate, as `dsv4bisect probe` runs them.
"""
