"""base_policy[experiment]: the model an experiment starts from (training/base_policy.py), one per
experiment, as its settings describe it."""

from dagster import AssetExecutionContext, Failure, MaterializeResult, MetadataValue, asset

from assets.lineage_check import report_off_lineage
from assets.partitions import experiments, refuse_beside_other_writers
from assets.pools import ACCELERATOR
from assets.resources import CrucibleResource
from training.base_policy import make_base_policy
from training.experiment import ExperimentConfig, ExperimentFileError
from training.iteration.tasks import loaded_task_set, prove_unproven, usable
from training.policy.checkpoint import CheckpointError, verify_checkpoint
from training.policy.importing import ModelImportError


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


@asset(partitions_def=experiments, group_name="policy", kinds={"pytorch"}, pool=ACCELERATOR)
def base_policy(context: AssetExecutionContext, crucible: CrucibleResource) -> MaterializeResult:
    """The experiment's own starting model: its `base_model` imported as it is (weights, config,
    tokenizer and chat template), or the built-in small Llama built from its `base` settings
    (nothing is downloaded either way); then warmed up on its task set's train references as
    single replies (and, with `episode_demonstrations`, as episodes of actions), `base.sft_steps`
    steps. Rebuilding one experiment's base policy never touches another's."""
    experiment = stored_experiment(crucible, context.partition_key)
    refuse_beside_other_writers(context.instance, context.run_id, experiment.name)
    out_dir = crucible.base_policy_dir(experiment.name)
    # Warmed up on what the iterations may sample: an imported set's tasks proven gradable only.
    loaded = loaded_task_set(crucible, experiment)
    prove_unproven(crucible, loaded, context.log.info)
    task_set = usable(crucible, loaded)

    def report(step: int, total: int, loss: float) -> None:
        if step == total or step % max(1, total // 10) == 0:
            context.log.info(f"warm-up step {step}/{total}: loss {loss:.3f}")

    replaced = _content_hash(out_dir)
    try:
        metrics = make_base_policy(experiment, task_set, out_dir, report, open_session=crucible.open_session)
    except ModelImportError as error:
        raise Failure(str(error), allow_retries=False) from None
    manifest = verify_checkpoint(out_dir)
    if "prompt_format_reason" in manifest:
        context.log.warning(f"{experiment.base_model}: {manifest['prompt_format_reason']} "
                            f"({manifest['completion_template']}; set prompt_format to choose)")
    if replaced not in (None, manifest["content_hash"]):
        report_off_lineage(context.instance, experiment.name, "the rebuilt base policy", 1,
                           crucible.store().iterations("checkpoints", experiment.name))
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
