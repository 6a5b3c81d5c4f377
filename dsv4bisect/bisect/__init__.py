"""Noise-aware search for the culprit patch set, the trial ledger and the driver."""
