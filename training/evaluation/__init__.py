"""Judging an iteration: the sample monitors before its training step and the stability
monitors after it (the held-out numbers are views: datastore/metrics.py)."""
