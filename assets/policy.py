"""base_policy[experiment]: the model an experiment starts from (training/base_policy.py), one per
experiment, as its settings describe it."""

import shutil

import pyarrow.parquet as pq
from dagster import AssetExecutionContext, Failure, MaterializeResult, MetadataValue, asset

from assets.failure_policy import failure_policy
from assets.lineage_check import report_off_lineage
from assets.partitions import experiments, refuse_beside_other_writers
from assets.pools import TRAINING
from assets.resources import CrucibleResource
from assets.training_step import TrainingStepClient
from training.experiment import ExperimentConfig, ExperimentFileError
from training.inference.engines import gpu_released
from training.iteration.tasks import loaded_task_set, prove_unproven, usable
from training.policy.checkpoint import CheckpointError, verify_checkpoint


def stored_experiment(crucible: CrucibleResource, name: str) -> ExperimentConfig:
    """The experiment's stored settings; a run of one that has none fails with how to create it."""
    if not crucible.experiment_exists(name):
        raise Failure(f"experiment {name!r} has no stored settings, so its runs would use guessed ones: create it "
                      "with the create_experiment job (its settings as TOML in the launchpad), or `crucible run "
                      f"--config FILE` (`crucible run --experiment {name}` for the defaults) with the same storage "
                      "as this instance", allow_retries=False)
    try:
        return crucible.experiment(name)
    except ExperimentFileError as error:
        raise Failure(str(error), allow_retries=False) from None


def _content_hash(directory) -> str | None:
    try:
        return verify_checkpoint(directory)["content_hash"]
    except CheckpointError:
        return None


@asset(partitions_def=experiments, group_name="policy", kinds={"pytorch"}, pool=TRAINING)
def base_policy(context: AssetExecutionContext, crucible: CrucibleResource,
                training_step: TrainingStepClient) -> MaterializeResult:
    """The experiment's own starting model: its `base_model` imported as it is (weights, config,
    tokenizer and chat template), or the built-in small Llama built from its `base` settings
    (nothing is downloaded either way); then warmed up on its task set's train references as
    single replies (and, with `episode_demonstrations`, as episodes of actions), `base.sft_steps`
    steps, by the training step's Pipes client (where the `grpo` section says it runs).
    Rebuilding one experiment's base policy never touches another's."""
    # Building or importing a model loads torch and transformers (seconds): imported here, so that
    # the code location, which every run and the daemon load, does not (tests/test_layers.py).
    from training.base_policy import base_policy_job
    from training.policy.importing import ModelImportError

    experiment = stored_experiment(crucible, context.partition_key)
    refuse_beside_other_writers(context.instance, context.run_id, experiment.name)
    out_dir = crucible.base_policy_dir(experiment.name)
    # Warmed up on what the iterations may sample: an imported set's tasks proven gradable only.
    loaded = loaded_task_set(crucible, experiment)
    prove_unproven(crucible, loaded, context.log.info)
    task_set = usable(crucible, loaded)
    replaced = _content_hash(out_dir)
    with failure_policy(crucible.store()):  # read before the policy is rebuilt: a retry sees the same
        trained = crucible.store().iterations("checkpoints", experiment.name)
    metrics = {"examples": 0}
    # Beside the policy, so that a container or pod of the warm-up finds its inputs where this
    # process left them; under a fixed name, so that what a killed run left is removed here.
    inputs = out_dir.parent / ".base-inputs"
    shutil.rmtree(inputs, ignore_errors=True)
    inputs.mkdir(parents=True)
    try:
        job = base_policy_job(experiment, task_set, out_dir, inputs, open_session=crucible.open_session)
        if job is not None:
            with gpu_released():
                invocation = training_step.run(context, crucible, extras={"job": job.model_dump(mode="json")})
            reported = invocation.get_materialize_result().metadata or {}
            metrics = {"examples": pq.ParquetFile(job.examples_file).metadata.num_rows,
                       **{f"sft/{key}": value for key, value in reported.items() if key != "content_hash"}}
    except ModelImportError as error:
        raise Failure(str(error), allow_retries=False) from None
    finally:
        shutil.rmtree(inputs, ignore_errors=True)
    manifest = verify_checkpoint(out_dir)
    if "prompt_format_reason" in manifest:
        context.log.warning(f"{experiment.base_model}: {manifest['prompt_format_reason']} "
                            f"({manifest['completion_template']}; set prompt_format to choose)")
    if replaced not in (None, manifest["content_hash"]):
        report_off_lineage(context.instance, experiment.name, "the rebuilt base policy", 1, trained)
    return MaterializeResult(
        metadata={
            "path": MetadataValue.path(str(out_dir)),
            "content_hash": manifest["content_hash"],
            "model": experiment.base_model or "built-in",
            "prompt_format": ": ".join(filter(None, (manifest.get("prompt_format", "chat"),
                                                     manifest.get("completion_template")))),
            "task_set_version": task_set.version,
            **metrics,
        }
    )
