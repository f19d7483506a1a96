"""Trajectory data platform: atomic Parquet datasets and DuckDB views. Never imports dagster."""
