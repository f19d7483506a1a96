"""An experiment's base policy: the model it starts from, warmed up on its task set's train
references (training/sft/), as its settings say.

The model is the built-in one (built locally from `base`'s sizes) or the user's `base_model`,
imported as it is (training/policy/importing.py). The warm-up teaches the answer format by
supervised fine-tuning on reference solutions rendered in the model's own chat format, as single
replies and, with `episode_demonstrations`, as episodes of actions.
"""

from __future__ import annotations

from pathlib import Path

from task_sets.loader import TaskSet
from training.agent.sessions import OpenSession
from training.experiment import ExperimentConfig
from training.policy.chat import ChatFormat
from training.policy.importing import import_model
from training.policy.model import build_base_policy
from training.policy.settings import PolicyConfig
from training.sft.demonstrations import warmup_examples
from training.sft.job import WarmupJob, write_examples
from training.sft.settings import SFTConfig


def base_policy_job(experiment: ExperimentConfig, task_set: TaskSet, out_dir: Path, scratch: Path,
                    open_session: OpenSession | None = None) -> WarmupJob | None:
    """Make the experiment's initial policy: at `out_dir` when it has no warm-up (and return
    None), else in `scratch`, beside the warm-up's demonstrations, and return the job that warms
    it up into `out_dir` (training/sft/job.py). `open_session` plays the demonstrations that run
    a task's check."""
    steps = experiment.base.sft_steps
    initial = _initial_policy(experiment, out_dir if steps == 0 else scratch / "initial")
    if steps == 0:
        return None
    chat = ChatFormat.from_pretrained(initial, experiment.observation_role)
    examples = warmup_examples(chat, experiment.warmup_tasks(task_set), episodes=experiment.base.episode_demonstrations,
                               system=task_set.system_message, open_session=open_session)
    write_examples(examples, scratch / "examples.parquet")
    sizes = {"micro_batch_tokens": experiment.base.sft_micro_batch_tokens} if experiment.base.sft_micro_batch_tokens else {}
    sft = SFTConfig(seed=experiment.seed, steps=steps, lr=experiment.base.sft_lr,
                    share_prefixes=experiment.base.sft_share_prefixes, **experiment.grpo.placement(), **sizes)
    return WarmupJob(initial_dir=str(initial), examples_file=str(scratch / "examples.parquet"), out_dir=str(out_dir),
                     sft=sft)


def _initial_policy(experiment: ExperimentConfig, out_dir: Path) -> Path:
    if experiment.base_model is not None:
        return import_model(experiment.base_model, out_dir, experiment.episode_max_tokens, experiment.prompt_format,
                            experiment.completion())
    settings = experiment.base
    return build_base_policy(out_dir, PolicyConfig(seed=experiment.seed, hidden_size=settings.hidden_size,
                                                   num_layers=settings.num_layers))
