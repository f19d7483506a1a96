"""The Dagster pool of the steps that hold the accelerator.

Sampling (vLLM on a GPU, transformers on the CPU's cores), training and the base policy's
warm-up each take the machine's accelerator whole. Steps in the `accelerator` pool never run at
the same time, in one run or across runs (a `crucible run`, a backfill and a sensor's run
included), whatever the run queue lets through: the instance grants the pool one slot
(pipelines/dagster.yaml, `concurrency.pools.default_limit`); a deployment with N accelerators
that runs may share raises it (`dagster instance concurrency set accelerator N`).
"""

ACCELERATOR = "accelerator"
