"""Profiles: YAML with positions, extends, overrides, validation, resolution, diff."""
