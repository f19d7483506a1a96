"""An experiment's base policy: the model it starts from, warmed up on its task set's train
references (training/sft/), as its settings say.

The model is the built-in one (built locally from `base`'s sizes) or the user's `base_model`,
imported as it is (training/policy/importing.py). The warm-up teaches the answer format by
supervised fine-tuning on reference solutions rendered in the model's own chat format, as single
replies and, with `episode_demonstrations`, as episodes of actions.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from task_sets.loader import TaskSet
from training.agent.sessions import OpenSession
from training.experiment import ExperimentConfig
from training.policy.chat import ChatFormat
from training.policy.importing import import_model
from training.policy.model import PolicyConfig, build_base_policy
from training.sft.demonstrations import warmup_examples
from training.sft.warmup import ProgressFn, SFTConfig, supervised_warmup


def make_base_policy(experiment: ExperimentConfig, task_set: TaskSet, out_dir: Path,
                     progress: ProgressFn | None = None, open_session: OpenSession | None = None) -> dict:
    """Write the experiment's base policy to `out_dir`; its metrics (`examples` and the
    warm-up's `sft/…`). `open_session` plays the demonstrations that run a task's check."""
    steps = experiment.base.sft_steps
    with tempfile.TemporaryDirectory() as scratch:
        initial = _initial_policy(experiment, out_dir if steps == 0 else Path(scratch) / "initial")
        if steps == 0:
            return {"examples": 0}
        chat = ChatFormat.from_pretrained(initial, experiment.observation_role)
        examples = warmup_examples(chat, experiment.warmup_tasks(task_set),
                                   episodes=experiment.base.episode_demonstrations,
                                   system=task_set.system_message, open_session=open_session)
        sft = SFTConfig(seed=experiment.seed, steps=steps, lr=experiment.base.sft_lr,
                        share_prefixes=experiment.base.sft_share_prefixes)
        metrics = supervised_warmup(initial, examples, out_dir, sft, progress)
    return {"examples": len(examples), **{f"sft/{key}": value for key, value in metrics.items()
                                          if isinstance(value, (int, float))}}


def _initial_policy(experiment: ExperimentConfig, out_dir: Path) -> Path:
    if experiment.base_model is not None:
        return import_model(experiment.base_model, out_dir, experiment.episode_max_tokens, experiment.prompt_format,
                            experiment.completion())
    settings = experiment.base
    return build_base_policy(out_dir, PolicyConfig(seed=experiment.seed, hidden_size=settings.hidden_size,
                                                   num_layers=settings.num_layers))
