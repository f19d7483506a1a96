"""ExperimentConfig: every setting of one experiment in one typed, documented place, the base
policy it starts from included (each experiment builds its own).

Stored as JSON beside the experiment's data, so that an iteration launched later (from the UI or
by the sensor) samples and trains exactly as the earlier ones did. One file (TOML, YAML or JSON)
describes an experiment: `crucible run --config FILE`.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from datastore.trackers import Tracker
from task_sets.loader import TaskSet
from task_sets.schema import Difficulty, Task
from task_sets.splits import hash_share
from training.evaluation.monitors import MonitorConfig
from training.inference.settings import ServerSettings, VLLMSettings
from training.policy.completion import CompletionTemplate, CompletionTemplateError, completion_template
from training.policy.settings import PolicyConfig
from training.rl.settings import GRPOConfig
from training.sft.settings import SFTConfig

# The truncation of Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
# (2025): it bounds a token's weight, so a sample the trained policy now finds far likelier than its
# sampler did cannot dominate the step.
STALE_SAMPLES_TIS_CAP = 2.0
IMPORTED_SFT_LR = 1e-5  # a usual fine-tuning rate for a pretrained model of 0.5-8B parameters
# (max_new_tokens, episode_max_tokens) where the experiment leaves them unset
BUILT_IN_BUDGETS, IMPORTED_BUDGETS = (96, 1024), (512, 2048)


class BasePolicySettings(BaseModel):
    """How the experiment's own base policy is made: the built-in model's size (unless the
    experiment imports a `base_model`), and the warm-up on its task set's train split."""

    model_config = ConfigDict(extra="forbid")

    hidden_size: int = PolicyConfig.model_fields["hidden_size"].default
    num_layers: int = PolicyConfig.model_fields["num_layers"].default
    sft_steps: int | None = Field(None, ge=0, description="warm-up optimizer steps on the train references (0: "
                                  f"none); default {SFTConfig.model_fields['steps'].default} for the built-in "
                                  "model, 0 for an imported base_model")
    sft_lr: float | None = Field(None, gt=0, description="the warm-up's peak learning rate; default "
                                 f"{SFTConfig.model_fields['lr'].default} for the built-in model (small, from scratch), "
                                 f"{IMPORTED_SFT_LR} for an imported base_model (pretrained: a high rate would undo it)")
    sft_share_prefixes: bool = Field(False, description="run the prefix a warm-up batch shares (chat header, system "
                                     "message) once: the same loss to float rounding on fewer tokens (repair: 35% less "
                                     "warm-up time), but another base policy than whole rows give, as rounding grows "
                                     "over the steps; off, the base policies of experiments stored before it existed "
                                     "are made again as they were")
    sft_micro_batch_tokens: int | None = Field(None, ge=1, description="tokens per forward pass of the warm-up, "
                                               "padded; default "
                                               f"{SFTConfig.model_fields['micro_batch_tokens'].default}, a whole batch "
                                               "in one pass: lower it where memory is short. The warm-up runs where "
                                               "the [grpo] section says the training step does (device, precision, "
                                               "ranks)")
    episode_demonstrations: bool | None = Field(None, description="also warm up on good episodes of actions (a task "
                                                "with a check command: run it, write the fix, submit; any other: write, "
                                                "then submit); default: when the experiment runs episodes (max_turns > 1)")
    warmup_fraction: float = Field(1.0, gt=0, le=1, description="share of the train split the warm-up demonstrates "
                                   "(drawn by task id hash); below 1, reinforcement learning samples only the rest, so "
                                   "no reward it earns can be the recall of a demonstrated answer")


class ExperimentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field("default", pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    base_model: str | None = Field(None, description="the causal LM to post-train: a Hugging Face directory, a hub "
                                   "id (the local cache, else downloaded where the network allows) or a GGUF file "
                                   "(dequantised once); None: the built-in model")
    task_set: str = Field("compose", description="built-in task set name or a path")
    iterations: int = Field(10, ge=1, description="the sensor stops advancing after this many")
    continuous: bool = Field(False, description="the advance_iterations sensor (when switched on) starts this "
                             "experiment's next iteration once the last one is evaluated")
    max_staleness: int = Field(0, ge=0, description="how many training steps behind the checkpoint it trains from an "
                               "iteration's samples may be: iteration N samples from the newest checkpoint of N-1-k … "
                               "N-1 whose training step has ended when it starts; 0: from N-1. Above 0, grpo.tis_cap "
                               "defaults to 2: the step corrects for older samples (docs/async.md)")
    plateau_patience: int | None = Field(None, ge=1, description="the sensor stops once the held-out pass rate "
                                         "has not beaten its best for this many iterations; None: never")
    tasks_per_iteration: int | None = Field(
        64, ge=1, description="train tasks sampled each iteration (seeded); None means all"
    )
    samples_per_task: int = Field(8, ge=2, description="GRPO group size K")
    engine: Literal["transformers", "vllm", "openai"] = Field(
        "transformers", description="what samples: transformers on CPU, vLLM on GPU (pip install -e '.[gpu]'; "
        "settings in `vllm`), or an OpenAI-compatible server (settings in `server`)")
    server: ServerSettings | None = Field(None, description="the server of engine = \"openai\"")
    vllm: VLLMSettings = VLLMSettings()
    max_new_tokens: int | None = Field(
        None, ge=8, description=f"response budget per sample (per turn in episodes); default {BUILT_IN_BUDGETS[0]} for "
        "the built-in model (the compose set's reference solutions take 21 tokens (median), 26 at most; a write "
        f"action of the default set's 39 (median), 54 (95th percentile)), {IMPORTED_BUDGETS[0]} for an imported "
        "base_model (an instruct model explains its code: SmolLM2-135M-Instruct's MBPP answers take 192 tokens on "
        "average, and 7% of them more than 384)")
    rollout_shards: int = Field(1, ge=1, description="slices of the sampled tasks (whole groups) that sample apart, "
                                "each with an engine of its own, as steps the executor may run side by side "
                                "(CRUCIBLE_STEP_PROCESSES processes). Part of the result: a shard's threads and "
                                "engine state are its own, so the same shards give the same samples one or several "
                                "at a time")
    max_turns: int = Field(1, ge=1, description="1: single-turn (the reply is the solution); more: multi-turn "
                           "episodes in a sandbox session, ended by a submit or this many turns (the repair set's "
                           "good episode takes 3: run the check, write the fix, submit)")
    observation_role: Literal["user", "tool"] = Field(
        "user", description="the chat role an episode's observations take: user (every template has it) or tool "
        "(for a template that frames tool output its own way, e.g. Qwen2.5's <tool_response>)")
    # Left out of the stored settings while unset, as report_to is: experiments stored before they
    # existed keep their config_hash.
    prompt_format: Literal["chat", "completion"] | None = Field(
        None, exclude_if=lambda value: value is None, description="how an imported base_model is prompted: chat "
        "(its own chat template) or completion (a completion template: training/policy/completion.py, "
        "docs/prompt-formats.md); None: chat where the model has a template, else completion (a base model)")
    completion_template: str | None = Field(
        None, exclude_if=lambda value: value is None, description="the completion template: a built-in (dialogue, "
        "the default: plain-text User/Assistant turns, episodes too; function: HumanEval's continuation of a "
        "function's prompt, one reply) or a Jinja file of your own (with stop_strings)")
    stop_strings: list[str] | None = Field(
        None, exclude_if=lambda value: value is None, description="text that ends a reply under the completion "
        "template (the next turn's header); None: the built-in template's own")
    episode_max_tokens: int | None = Field(
        None, ge=64, description="an episode's whole context budget (prompt, replies, observations); at most the "
        f"model's max_position_embeddings; default {BUILT_IN_BUDGETS[1]} for the built-in model, "
        f"{IMPORTED_BUDGETS[1]} for an imported base_model")
    command_timeout_s: float = Field(10.0, gt=0, description="wall limit of each command an episode runs")
    temperature: float = Field(
        0.6, gt=0,
        description="the one temperature: rollouts sample at it and the trainer recomputes log-probs at it (the "
        "importance ratio is only right if the two agree); 0.6 keeps the warmed-up default model's samples mostly "
        "valid Python (experiments/repair.toml samples at 1.0: its warmed-up policy's groups of 8 carry a reward "
        "spread 19 times in 32 at 1.0, 12 at 0.6)",
    )
    difficulties: list[Difficulty] | None = Field(
        None, min_length=1, exclude_if=lambda tiers: tiers is None,
        description="the difficulty tiers (the tasks' `difficulty`) the iterations train on and the held-out "
        "evaluation measures; None: every tier. A model that solves a few tasks of a set learns where it solves "
        "some: a group whose answers all fail teaches nothing")
    eval_tasks: int | None = Field(None, ge=1, description="held-out tasks per evaluation (the first of the "
                                   "split, in the set's order); None means all")
    eval_samples: int = Field(8, ge=1, description="answers per held-out task: 1 is greedy; more are sampled at "
                              "`temperature`, and a task's pass rate is the share that passed")
    eval_blanked: bool = Field(True, description="evaluate each checkpoint a second time with every observation "
                               "hidden from the policy (the commands still run): the gap between the two pass rates "
                               "is what execution feedback is worth to it. Episodes only (max_turns > 1): a single "
                               "reply sees no observation")
    eval_blanked_samples: int | None = Field(None, ge=1, description="episodes per held-out task of the blanked "
                                             "evaluation, drawn as the shown one's are; None: eval_samples. A blind "
                                             "policy that rarely passes needs fewer to show it, and its episodes "
                                             "are the longest (it writes at every turn, never reading a failure)")
    regrade_fraction: float = Field(
        0.05, ge=0, le=1,
        description="share of each iteration's submissions graded a second time, in fresh sandboxes, "
        "to measure how reproducible the verdicts are (0 turns it off)",
    )
    refill_rounds: int = Field(
        0, ge=0, description="dynamic sampling: while fewer groups than tasks_per_iteration have a reward spread, "
        "sample and grade up to this many extra rounds of fresh train tasks (0: off; the trainer still drops "
        "zero-variance groups unless grpo.zero_variance_groups is 'keep'). Off by default: on compose about half "
        "of 64 groups carry signal, so one round doubled sampling and grading (218 s an iteration instead of ~125)")
    seed: int = 0
    # Left out of the stored settings (and so of the checkpoints' config_hash) while empty: an
    # experiment that reports nowhere is stored, and hashed, as it was before the setting existed.
    report_to: list[Tracker] = Field([], exclude_if=lambda trackers: not trackers, description="the experiment "
                                     "trackers its numbers also go to, as in TRL: tensorboard, mlflow (docs/"
                                     "trackers.md); where they are written, not what is trained, so it may change "
                                     "once the experiment has run")
    base: BasePolicySettings = BasePolicySettings()
    grpo: GRPOConfig = GRPOConfig()
    monitors: MonitorConfig = MonitorConfig()

    def completion(self) -> CompletionTemplate:
        """The completion template a base model without a chat template is prompted with."""
        return completion_template(self.completion_template, self.stop_strings)

    def warmup_tasks(self, task_set: TaskSet) -> list[Task]:
        """The train tasks the base policy's warm-up demonstrates."""
        warmed = self._warmed(task_set)
        return [task for task in self._tiered(task_set.train(), task_set, "train") if task.id in warmed]

    def rl_tasks(self, task_set: TaskSet) -> list[Task]:
        """The train tasks iterations sample: those of the experiment's tiers, less those the
        warm-up demonstrated when it demonstrated a share only."""
        train = self._tiered(task_set.train(), task_set, "train")
        if self.base.warmup_fraction == 1:
            return train
        warmed = self._warmed(task_set)
        left = [task for task in train if task.id not in warmed]
        if not left:
            raise ValueError(f"base.warmup_fraction {self.base.warmup_fraction} leaves none of task set "
                             f"{task_set.name!r}'s {len(train)} train tasks for the iterations to sample: lower it")
        return left

    def held_out_tasks(self, task_set: TaskSet) -> list[Task]:
        """The eval tasks every evaluation of this experiment measures: the first `eval_tasks` of
        the experiment's tiers."""
        return self._tiered(task_set.eval(), task_set, "eval")[: self.eval_tasks]

    def _tiered(self, tasks: list[Task], task_set: TaskSet, split: str) -> list[Task]:
        if self.difficulties is None:
            return tasks
        kept = [task for task in tasks if task.difficulty in self.difficulties]
        if not kept:
            raise ValueError(f"difficulties {self.difficulties} leave none of task set {task_set.name!r}'s "
                             f"{len(tasks)} {split} tasks (its tiers: {sorted({t.difficulty for t in tasks})})")
        return kept

    def _warmed(self, task_set: TaskSet) -> set[str]:
        return hash_share([task.id for task in self._tiered(task_set.train(), task_set, "train")],
                          self.base.warmup_fraction, salt="warmup:")

    @model_validator(mode="after")
    def _consistent(self) -> ExperimentConfig:
        """The built-in model's sizes do not apply to an imported model, and the token budgets and
        the warm-up's length default by which of the two the experiment starts from; a server is given
        exactly when the engine is one; a greedy evaluation draws one blanked episode per task."""
        sizes = [name for name in ("hidden_size", "num_layers")
                 if getattr(self.base, name) != BasePolicySettings.model_fields[name].default]
        if self.base_model is not None and sizes:
            raise PydanticCustomError("imported_sizes", f"base.{', base.'.join(sizes)} size the built-in model, and "
                                      f"this experiment imports base_model {self.base_model!r}: remove them")
        if self.eval_samples == 1 and (self.eval_blanked_samples or 1) > 1:
            raise PydanticCustomError("greedy_blanked", f"eval_samples = 1 evaluates greedily, so its "
                                      f"{self.eval_blanked_samples} blanked episodes per task would all be the same: "
                                      "set eval_blanked_samples to 1, or sample with eval_samples > 1")
        prompted = [name for name in ("prompt_format", "completion_template", "stop_strings")
                    if getattr(self, name) is not None]
        if prompted and self.base_model is None:
            raise PydanticCustomError("built_in_prompt_format", f"{', '.join(prompted)} choose how an imported "
                                      "base_model is prompted, and the built-in model has its own chat template: "
                                      "set base_model, or remove them")
        if self.prompt_format == "chat" and (self.completion_template or self.stop_strings) is not None:
            raise PydanticCustomError("chat_completion_template", "completion_template and stop_strings apply to "
                                      "prompt_format = \"completion\", and this experiment prompts with the chat template")
        if self.completion_template is not None or self.stop_strings is not None:
            try:
                template = self.completion()
            except CompletionTemplateError as error:
                raise PydanticCustomError("completion_template", str(error)) from None
            if template.single_turn and self.max_turns > 1:
                raise PydanticCustomError("single_turn_template", f"completion_template {template.name!r} renders "
                                          f"one reply, and max_turns = {self.max_turns} runs episodes: use dialogue "
                                          "or a template of your own")
        if (self.engine == "openai") != (self.server is not None):
            raise PydanticCustomError("engine_server", "engine = \"openai\" samples from the [server] the settings "
                                      "describe (base_url, model), and only that engine has one")
        imported = self.base_model is not None
        budgets = dict(zip(("max_new_tokens", "episode_max_tokens"), IMPORTED_BUDGETS if imported else BUILT_IN_BUDGETS))
        for name, value in budgets.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        defaults = {"sft_steps": 0 if imported else SFTConfig.model_fields["steps"].default,
                    "sft_lr": IMPORTED_SFT_LR if imported else SFTConfig.model_fields["lr"].default,
                    "episode_demonstrations": self.max_turns > 1}
        unset = {name: value for name, value in defaults.items() if getattr(self.base, name) is None}
        if unset:
            self.base = self.base.model_copy(update=unset)
        return self

    @model_validator(mode="after")
    def _older_samples_are_corrected(self) -> ExperimentConfig:
        """Samples from an older checkpoint are weighted towards the one the step starts from
        (truncated importance sampling, training/rl/grpo.py): on by default where there may be any."""
        if self.max_staleness and self.grpo.tis_cap is None:
            self.grpo = self.grpo.model_copy(update={"tis_cap": STALE_SAMPLES_TIS_CAP})
        return self

    @model_validator(mode="before")
    @classmethod
    def _one_temperature(cls, settings: object) -> object:
        """`grpo.temperature` was once a setting of its own, silently overridden by `temperature`:
        accepted when it agrees, refused when it does not."""
        if not (isinstance(settings, dict) and isinstance(settings.get("grpo"), dict)
                and "temperature" in settings["grpo"]):
            return settings
        grpo = dict(settings["grpo"])
        trainer, sampling = grpo.pop("temperature"), settings.get("temperature", cls.model_fields["temperature"].default)
        if trainer != sampling:
            raise PydanticCustomError("one_temperature", f"grpo.temperature ({trainer}) differs from temperature ({sampling}): the trainer "
                             "recomputes log-probs at the temperature the samples were drawn at, so there is one "
                             "setting; set `temperature` only")
        return {**settings, "grpo": grpo}


class ExperimentFileError(ValueError):
    """An experiment file that cannot be read or does not describe a valid experiment."""


def load_experiment_file(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment file; every problem is reported as `file: field: reason`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ExperimentFileError(f"{path}: cannot read: {error.strerror}") from None
    return parse_experiment(text, path.suffix.lstrip("."), str(path))


def parse_experiment(text: str, kind: str, source: str, required: tuple[str, ...] = ()) -> ExperimentConfig:
    """Settings written as `kind` (toml, yaml, yml or json), validated, the `required` ones given;
    problems name `source`."""
    try:
        if kind == "toml":
            document = tomllib.loads(text)
        elif kind in ("yaml", "yml"):
            document = yaml.safe_load(text)
        elif kind == "json":
            document = json.loads(text)
        else:
            raise ExperimentFileError(f"{source}: unknown format {kind!r} (use .toml, .yaml or .json)")
    except (tomllib.TOMLDecodeError, yaml.YAMLError, json.JSONDecodeError) as error:
        raise ExperimentFileError(f"{source}: not valid {kind.upper()}: {error}") from None
    missing = [name for name in required if not isinstance(document, dict) or name not in document]
    if missing:
        raise ExperimentFileError("\n".join(f"{source}: field '{name}': required" for name in missing))
    return experiment_from(document, source)


def experiment_from(document: object, source: str) -> ExperimentConfig:
    """Settings read from `source` (a file, or the stored settings of an experiment), validated;
    every problem is reported as `source: field 'name': reason`."""
    if not isinstance(document, dict):
        raise ExperimentFileError(f"{source}: expected a table of settings at the top level")
    try:
        return ExperimentConfig.model_validate(document)
    except ValidationError as error:
        problems = [f"{source}: " + (f"field '{'.'.join(str(p) for p in e['loc'])}': " if e["loc"] else "")
                    + e["msg"] for e in error.errors()]
        raise ExperimentFileError("\n".join(problems)) from None


# How long an experiment runs, not how: the settings that may change after it has run.
LIFE_SETTINGS = {"iterations", "continuous", "plateau_patience"}
# Where and in what pieces the training step runs, not what it learns: they may change too (an
# experiment moved to a GPU node, or given more ranks or memory).
RUN_SETTINGS = {f"grpo.{name}" for name in ("device", "precision", "parallel", "micro_batch_tokens",
                                            "logprob_chunk_tokens", "gradient_checkpointing", "save_progress_every",
                                            "max_shard_size", "threads")} | {"base.sft_micro_batch_tokens"}
# Where the numbers are also reported, not what they are: it may change too.
REPORT_SETTINGS = {"report_to"}


def updated_settings(stored: ExperimentConfig | None, new: ExperimentConfig) -> ExperimentConfig:
    """What to store for an experiment stored as `stored` (None: a new one) that `new` describes:
    refused when it changes more than how long the experiment runs, and its iteration limit
    is never lowered (it changes only when asked for, upwards)."""
    if stored is None:
        return new
    changed = differing_settings(stored, new)
    if changed:
        may_change = ", ".join(sorted(LIFE_SETTINGS | REPORT_SETTINGS))
        raise ExperimentFileError(f"experiment {new.name!r} is stored with other settings ({', '.join(changed)} "
                                  f"differ): give it a new `name`, or change only {may_change} "
                                  "and how the training step runs (device, ranks, micro-batches)")
    return new.model_copy(update={"iterations": max(new.iterations, stored.iterations)})


def differing_settings(stored: ExperimentConfig, new: ExperimentConfig) -> list[str]:
    """Settings (dotted names) that differ, other than how long the experiment runs, how its
    training step runs and where its numbers are reported."""
    a, b = stored.model_dump(mode="json"), new.model_dump(mode="json")
    return sorted(_differences(a, b, ignore=LIFE_SETTINGS | RUN_SETTINGS | REPORT_SETTINGS))


def _differences(a: dict, b: dict, ignore: set[str], prefix: str = "") -> set[str]:
    out = set()
    for key in a.keys() | b.keys():
        if prefix + key in ignore:
            continue
        if isinstance(a.get(key), dict) and isinstance(b.get(key), dict):
            out |= _differences(a[key], b[key], ignore, f"{prefix}{key}.")
        elif a.get(key) != b.get(key):
            out.add(prefix + key)
    return out
