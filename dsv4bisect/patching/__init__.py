"""Patch declarations, the registry and the patch-set wire format."""
