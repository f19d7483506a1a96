"""The `checkpoint` asset's training step, in a process of its own (Dagster Pipes).

    python -m assets.train_process        # launched by PipesSubprocessClient
    torchrun --nproc-per-node N -m assets.train_process   # N data parallel ranks (GPUs of a node)

Rank 0 opens the Pipes session: it reads the TrainJob from the Pipes extras and hands it to
the other ranks, streams every optimizer step back (a log line and a custom message with the
step's statistics) and reports the checkpoint's metrics as the materialization's metadata. The
other ranks only compute. It imports dagster_pipes only, never dagster.
"""

from __future__ import annotations

from dagster_pipes import PipesContext, open_dagster_pipes
from transformers.utils import logging as transformers_logging

from training.rl.distributed import broadcast, process_group
from training.rl.step import TrainJob, run_train_job

STEP_MESSAGE = "train_step"


def main() -> None:
    transformers_logging.disable_progress_bar()  # the step reports its own progress, step by step
    with process_group() as ranks:
        if not ranks.writes:
            run_train_job(TrainJob.model_validate(broadcast(None)))
            return
        with open_dagster_pipes() as pipes:
            job = TrainJob.model_validate(broadcast(pipes.get_extra("job")))
            metrics, manifest = run_train_job(job, progress=lambda *step: _report_step(pipes, *step))
            numbers = {key: value for key, value in metrics.items() if isinstance(value, (int, float))}
            pipes.report_asset_materialization(metadata={**numbers, "content_hash": manifest["content_hash"],
                                                         "global_step": manifest["global_step"]})


def _report_step(pipes: PipesContext, step: int, total: int, stats: dict) -> None:
    pipes.log.info(f"train step {step}/{total}: loss {stats['loss']:.4f}, entropy {stats['entropy']:.3f}, "
                   f"kl before the step {stats['approx_kl']:.2e}, grad norm {stats['grad_norm']:.3f}")
    pipes.report_custom_message({"kind": STEP_MESSAGE, "step": step, "total": total, **stats})


if __name__ == "__main__":
    main()
