"""Isolated execution of untrusted code and the grading protocol. Never imports dagster."""
