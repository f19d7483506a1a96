"""One training step, as `python -m assets.train_process` runs its job (training/rl/job.py).

The job names its inputs by location (parent checkpoint, trajectory partition, reference policy)
rather than carrying them, so that the step can run as its own process, under `torchrun` on a
GPU node as well as beside the orchestrator, and can simply be run again after a crash
(train_policy resumes from its saved progress).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from datastore.store import DatasetStore
from statuses import RewardStatus
from training.optim.distributed import current_ranks
from training.policy.checkpoint import verify_checkpoint
from training.rl.job import TrainJob
from training.rl.trainer import ProgressFn, TrainSample, train_policy


def run_train_job(job: TrainJob, progress: ProgressFn | None = None) -> tuple[dict, dict | None]:
    """Train, then verify what was written; returns (metrics, the new checkpoint's manifest),
    the manifest on the writing rank only (None on the others)."""
    table = DatasetStore(job.storage_root).read_files("trajectories", job.trajectory_files)
    samples = train_samples(table)
    if not samples:
        raise ValueError(f"trajectories {', '.join(job.trajectory_files)} hold no trainable sample "
                         "(every row is an infrastructure error, invalid, or has no behaviour log-probs)")
    metrics = train_policy(job.parent_dir, samples, job.out_dir, job.grpo, progress=progress,
                           lineage=job.lineage, reference_dir=job.reference_dir, temperature=job.temperature)
    return metrics, verify_checkpoint(job.out_dir) if current_ranks().writes else None


def train_samples(table: pa.Table) -> list[TrainSample]:
    """Scored rows as training samples; infrastructure errors, invalid grades and samples
    without behaviour log-probs (text-only HTTP engines) are masked out."""
    columns = ["prompt_token_ids", "response_token_ids", "behaviour_logprobs", "reward", "group_id", "sample_index",
               "loss_mask"]
    usable = pc.and_(pc.equal(table["reward_status"], RewardStatus.SCORED.value), pc.is_valid(table["behaviour_logprobs"]))
    rows = table.filter(usable).select(columns).to_pylist()
    return [
        TrainSample(
            prompt_ids=row["prompt_token_ids"],
            response_ids=row["response_token_ids"],
            behaviour_logprobs=row["behaviour_logprobs"],
            reward=row["reward"],
            group_id=row["group_id"],
            loss_mask=row["loss_mask"],
            sample_index=row["sample_index"],
        )
        for row in rows
    ]
