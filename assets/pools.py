"""The Dagster pools of the steps that hold an accelerator.

    sampling   rollout shards and held-out evaluations (vLLM on a GPU, transformers on the CPU's cores)
    training   training steps and the base policy's warm-up

Steps of one pool never run at the same time, in one run or across runs (a `crucible run`, a
backfill and a sensor's run included), whatever the run queue lets through: the instance grants
every pool without a limit of its own one slot (pipelines/dagster.yaml, `concurrency.pools.default_limit`).
A deployment with N inference GPUs (or nodes) sets `dagster instance concurrency set sampling N`.
The two pools are apart so that an experiment's iterations can overlap (`max_staleness` ≥ 1, the
run queue's lanes: pipelines/run_lanes.py): iteration N+1 samples while iteration N trains, as on
a cluster where the sampler and the trainer are different machines. Iterations that do not
overlap (`max_staleness` 0, the default) never run a sampling step beside a training step. A pool
orders steps, not memory: sampling beside training on one GPU needs the memory of both.

Across runs the pools are exact on the Postgres instance. On the embedded SQLite one, Dagster's
slot claim is not atomic across processes (a read, then an update without a check), so two runs
starting steps in the same instant could both take a slot: there the queue, one run at a time
but for overlapping iterations, is what keeps a pool to one step; run experiments side by side
on the Postgres instance.
"""

SAMPLING = "sampling"
TRAINING = "training"
POOLS = (SAMPLING, TRAINING)
