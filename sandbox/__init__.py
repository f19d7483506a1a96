"""Isolated execution of untrusted code: sessions, limits, the pool. Never imports dagster."""
