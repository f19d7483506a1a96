"""base_policy: the default model, built locally and warmed up on reference solutions."""

import tempfile

from dagster import (
    AssetExecutionContext,
    Config,
    MaterializeResult,
    MetadataValue,
    asset,
)

from assets.resources import CrucibleResource
from task_sets.loader import load_task_set
from training.policy.checkpoint import verify_checkpoint
from training.policy.model import PolicyConfig, build_base_policy
from training.policy.tokenizer import build_tokenizer
from training.sft.demonstrations import warmup_examples
from training.sft.warmup import SFTConfig, supervised_warmup


class BasePolicyConfig(Config):
    """Defaults build the 3.43M-parameter default model; tests shrink it."""

    task_set: str = "compose"
    seed: int = 0
    hidden_size: int = PolicyConfig.model_fields["hidden_size"].default
    num_layers: int = PolicyConfig.model_fields["num_layers"].default
    sft_steps: int = SFTConfig.model_fields["steps"].default
    # Multi-turn experiments (max_turns > 1) need a policy that writes actions: turn this on.
    episode_demonstrations: bool = False


@asset(group_name="policy", kinds={"pytorch"})
def base_policy(
    context: AssetExecutionContext, config: BasePolicyConfig, crucible: CrucibleResource
) -> MaterializeResult:
    """A small Llama built from a config (nothing is downloaded), fine-tuned on the train split's
    reference solutions as single replies (and, with `episode_demonstrations`, as episodes of
    actions too), so that RL starts from a policy that sometimes succeeds."""
    task_set = load_task_set(config.task_set)
    examples = warmup_examples(build_tokenizer(), task_set.train(), episodes=config.episode_demonstrations)
    sft_config = SFTConfig(seed=config.seed, steps=config.sft_steps)
    policy_config = PolicyConfig(seed=config.seed, hidden_size=config.hidden_size, num_layers=config.num_layers)

    def report(step: int, total: int, loss: float) -> None:
        if step == total or step % max(1, total // 10) == 0:
            context.log.info(f"warm-up step {step}/{total}: loss {loss:.3f}")

    with tempfile.TemporaryDirectory() as scratch:
        initial = build_base_policy(f"{scratch}/init", policy_config)
        metrics = supervised_warmup(initial, examples, crucible.base_policy_dir(), sft_config, report)
    manifest = verify_checkpoint(crucible.base_policy_dir())
    return MaterializeResult(
        metadata={
            "path": MetadataValue.path(str(crucible.base_policy_dir())),
            "content_hash": manifest["content_hash"],
            "task_set_version": task_set.version,
            "examples": len(examples),
            **{f"sft/{key}": value for key, value in metrics.items() if isinstance(value, (int, float))},
        }
    )
