"""The training jobs of the `base_policy` and `checkpoint` assets, in a process of their own
(Dagster Pipes): the warm-up (training/sft/job.py) and the RL step (training/rl/step.py).

    python -m assets.train_process        # launched by PipesSubprocessClient
    torchrun --nproc-per-node N -m assets.train_process   # N data parallel ranks (GPUs of a node)

Rank 0 opens the Pipes session: it reads the job from the Pipes extras and hands it to the
other ranks, streams every optimizer step back (a custom message with the step's statistics,
and a log line) and reports the written policy's metrics as the materialization's metadata.
The other ranks only compute. It imports dagster_pipes only, never dagster.
"""

from __future__ import annotations

from typing import Annotated

from dagster_pipes import PipesContext, open_dagster_pipes
from pydantic import Field, TypeAdapter
from transformers.utils import logging as transformers_logging

from assets.step_messages import STEP_MESSAGE
from training.optim.distributed import broadcast, process_group
from training.rl.job import TrainJob
from training.rl.step import run_train_job
from training.sft.job import WarmupJob
from training.sft.warmup import run_warmup_job

JOBS = TypeAdapter(Annotated[TrainJob | WarmupJob, Field(discriminator="kind")])


def main() -> None:
    transformers_logging.disable_progress_bar()  # the job reports its own progress, step by step
    with process_group() as ranks:
        if not ranks.writes:
            _run(JOBS.validate_python(broadcast(None)))
            return
        with open_dagster_pipes() as pipes:
            job = JOBS.validate_python(broadcast(pipes.get_extra("job")))
            metrics, manifest = _run(job, progress=lambda *step: _report_step(pipes, job, *step))
            numbers = {key: value for key, value in metrics.items() if isinstance(value, (int, float))}
            written = {key: manifest[key] for key in ("content_hash", "global_step") if key in manifest}
            pipes.report_asset_materialization(metadata={**numbers, **written})


def _run(job: TrainJob | WarmupJob, progress=None) -> tuple[dict, dict | None]:
    return run_warmup_job(job, progress) if isinstance(job, WarmupJob) else run_train_job(job, progress)


def _report_step(pipes: PipesContext, job: TrainJob | WarmupJob, step: int, total: int, stats: dict) -> None:
    pipes.report_custom_message({"kind": STEP_MESSAGE, "step": step, "total": total, **stats})
    if isinstance(job, WarmupJob):
        if step == total or step % max(1, total // 10) == 0:  # a warm-up takes hundreds of short steps
            pipes.log.info(f"warm-up step {step}/{total}: loss {stats['loss']:.3f}")
        return
    pipes.log.info(f"train step {step}/{total}: loss {stats['loss']:.4f}, entropy {stats['entropy']:.3f}, "
                   f"kl before the step {stats['approx_kl']:.2e}, grad norm {stats['grad_norm']:.3f}")


if __name__ == "__main__":
    main()
