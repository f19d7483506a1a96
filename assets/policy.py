"""base_policy[experiment]: the built-in model, built locally and warmed up on reference solutions,
one per experiment, as its settings (`ExperimentConfig.base`) describe it."""

import tempfile

from dagster import AssetExecutionContext, Failure, MaterializeResult, MetadataValue, asset

from assets.lineage_check import report_off_lineage
from assets.partitions import experiments
from assets.resources import CrucibleResource
from task_sets.loader import load_task_set
from training.experiment import ExperimentConfig, ExperimentFileError
from training.policy.chat import ChatFormat
from training.policy.checkpoint import CheckpointError, verify_checkpoint
from training.policy.model import PolicyConfig, build_base_policy
from training.sft.demonstrations import warmup_examples
from training.sft.warmup import SFTConfig, supervised_warmup


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


@asset(partitions_def=experiments, group_name="policy", kinds={"pytorch"})
def base_policy(context: AssetExecutionContext, crucible: CrucibleResource) -> MaterializeResult:
    """A small Llama built from the experiment's `base` settings (nothing is downloaded),
    fine-tuned on its task set's train references as single replies (and, with
    `episode_demonstrations`, as episodes of actions too), so that RL starts from a policy that
    sometimes succeeds. Rebuilding one experiment's base policy never touches another's."""
    experiment = stored_experiment(crucible, context.partition_key)
    settings, out_dir = experiment.base, crucible.base_policy_dir(experiment.name)
    task_set = load_task_set(experiment.task_set)
    sft_config = SFTConfig(seed=experiment.seed, steps=settings.sft_steps)
    policy_config = PolicyConfig(seed=experiment.seed, hidden_size=settings.hidden_size, num_layers=settings.num_layers)

    def report(step: int, total: int, loss: float) -> None:
        if step == total or step % max(1, total // 10) == 0:
            context.log.info(f"warm-up step {step}/{total}: loss {loss:.3f}")

    replaced = _content_hash(out_dir)
    with tempfile.TemporaryDirectory() as scratch:
        initial = build_base_policy(f"{scratch}/init", policy_config)
        examples = warmup_examples(ChatFormat.from_pretrained(initial), task_set.train(),
                                   episodes=settings.episode_demonstrations)
        metrics = supervised_warmup(initial, examples, out_dir, sft_config, report)
    manifest = verify_checkpoint(out_dir)
    if replaced not in (None, manifest["content_hash"]):
        report_off_lineage(context.instance, experiment.name, "the rebuilt base policy", 1,
                           crucible.store().iterations("checkpoints", experiment.name))
    return MaterializeResult(
        metadata={
            "path": MetadataValue.path(str(out_dir)),
            "content_hash": manifest["content_hash"],
            "task_set_version": task_set.version,
            "examples": len(examples),
            **{f"sft/{key}": value for key, value in metrics.items() if isinstance(value, (int, float))},
        }
    )
