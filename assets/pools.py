"""The Dagster pools of the steps that hold an accelerator.

    sampling   rollout shards and held-out evaluations (vLLM on a GPU, transformers on the CPU's cores)
    training   training steps and the base policy's warm-up

Steps of one pool never run at the same time, in one run or across runs (a `crucible run`, a
backfill and a sensor's run included), whatever the run queue lets through: the instance grants
every pool without a limit of its own one slot (pipelines/dagster.yaml, `concurrency.pools.default_limit`).
A deployment with N inference GPUs (or nodes) sets `dagster instance concurrency set sampling N`.
The two pools are apart so that runs can overlap (an experiment's iterations with `max_staleness`
≥ 1: pipelines/run_lanes.py; two experiments side by side): iteration N+1 samples while iteration
N trains, as on a cluster where the sampler and the trainer are different machines. A pool orders
steps, not memory: sampling beside training on one GPU needs the memory of both.

Across runs the pools are exact on the Postgres instance. On the embedded SQLite one, Dagster's
slot claim is not atomic across processes (a read, then an update without a check), so two runs
starting steps of a pool in the same instant could both take its slot: on CPU cores that costs
time, on a GPU memory; overlap runs on a GPU on the Postgres instance.
"""

SAMPLING = "sampling"
TRAINING = "training"
POOLS = (SAMPLING, TRAINING)
