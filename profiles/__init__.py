"""Shipped profiles (YAML data only)."""
