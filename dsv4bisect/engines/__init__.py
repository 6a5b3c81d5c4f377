"""Launching engine processes (reference, sglang, command), readiness, receipts, teardown."""
