"""Helpers for tests, importable by spawned ranks (so they live in the package)."""
