"""The Dagster pool of the steps that hold the accelerator.

Sampling (vLLM on a GPU, transformers on the CPU's cores), training and the base policy's
warm-up each take the machine's accelerator whole. Steps in the `accelerator` pool never run at
the same time, in one run or across runs (a `crucible run`, a backfill and a sensor's run
included), whatever the run queue lets through: the instance grants every pool without a limit
of its own one slot (pipelines/dagster.yaml, `concurrency.pools.default_limit`); a deployment with
N accelerators that runs may share sets this one's (`dagster instance concurrency set accelerator
N`). The pool orders steps, not memory: a vLLM engine a process keeps between its steps still
holds its share of the GPU.
"""

ACCELERATOR = "accelerator"
