"""Rendering run and bisect results: terminal, markdown, JSON, plots."""
