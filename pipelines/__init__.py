"""Dagster Definitions, jobs, sensors and the `crucible` command line."""
