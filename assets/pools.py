"""The Dagster pool of the steps that hold the accelerator.

Sampling (vLLM on a GPU, transformers on the CPU's cores), training and the base policy's
warm-up each take the machine's accelerator whole. Steps in the `accelerator` pool never run at
the same time, in one run or across runs (a `crucible run`, a backfill and a sensor's run
included), whatever the run queue lets through: the instance grants every pool without a limit
of its own one slot (pipelines/dagster.yaml, `concurrency.pools.default_limit`); a deployment with
N accelerators that runs may share sets this one's (`dagster instance concurrency set accelerator
N`). The pool orders steps, not memory: a vLLM engine a process keeps between its steps still
holds its share of the GPU.

Across runs the pool is exact on the Postgres instance. On the embedded SQLite one, Dagster's
slot claim is not atomic across processes (a read, then an update without a check), so two runs
starting steps in the same instant could both take the slot: there the queue, one run at a time,
is what keeps the accelerator to one step; run several at once on the Postgres instance.
"""

ACCELERATOR = "accelerator"
