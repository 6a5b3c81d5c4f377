"""The long-context coherence probe: seeded multi-turn families, paired statistics, verdicts."""
