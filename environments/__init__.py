"""Task environments: what a task's tests need installed, declared as data (spec.py), built once
per digest for the local backend and for Docker (build.py), and kept in a store (store.py)."""
