"""Arrow schemas of the datasets Crucible stores, documented column by column.

Every dataset is hive-partitioned by `experiment=` and `iteration=`; those two columns live in
the directory names, not in the files, and every reader (DuckDB, polars, pyarrow) restores them.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from statuses import ClosedSet, ExecStatus, FailureReason, Outcome, RewardStatus, TamperFlag

# Written into every Parquet file and manifest; raised whenever a dataset's columns change, so a
# reader can tell which columns a file has (what each version changed: CHANGELOG.md).
SCHEMA_VERSION = 12


class Observations(ClosedSet):
    """What an evaluated episode's policy was shown of its actions' results."""

    SHOWN = "shown", "what each action answered (the normal evaluation)"
    BLANKED = "blanked", ("the same fixed text after every action: the commands ran, their output was hidden from "
                          "the policy (what execution feedback is worth is the difference)")


class FinishReason(ClosedSet):
    """How a sample ended: a single reply by its engine's word, an episode by what stopped it."""

    STOP = "stop", "the reply ended at a stop token (a single-turn sample)"
    LENGTH = "length", "the reply was cut at max_new_tokens (a single-turn sample; truncated)"
    SUBMITTED = "submitted", "the episode's policy submitted its workspace"
    MAX_TURNS = "max_turns", "the episode used its turns without submitting; its workspace was graded"
    WALL_TIME = "wall_time", "the episode ran out of wall-clock time; its workspace was graded"
    MAX_TOKENS = "max_tokens", ("the episode's context had no room for another reply (episode_max_tokens); "
                                "its workspace was graded (truncated)")


# What truncation_rate counts (datastore/metrics.py): samples a token budget cut short.
TRUNCATED = (FinishReason.LENGTH, FinishReason.MAX_TOKENS)


def _field(name: str, type_: pa.DataType, doc: str, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc})


# One turn of an episode, enough to replay it: what the policy wrote, what ran, what it saw.
TURN = pa.struct(
    [
        ("index", pa.int32()),
        ("reply", pa.string()),  # the policy's text this turn
        ("action", pa.string()),  # run | write | replace | submit | malformed
        ("detail", pa.string()),  # the command, the path, or why the reply was malformed
        ("status", pa.string()),  # ok | error | submitted
        ("exit_code", pa.int32()),  # of a run; null otherwise
        ("observation_excerpt", pa.string()),  # what the action answered (shown next, unless blanked)
        ("generate_s", pa.float64()),
        ("exec_s", pa.float64()),
        ("sampled_tokens", pa.int32()),
    ]
)

TEST_RESULT = pa.struct([("name", pa.string()), ("outcome", pa.string()), ("message", pa.string())])  # Outcome
PASSED_DOC = ("scored, no tamper flag, not killed, a report, and every expected test passed "
              "(GradeResult.passed, the one definition every pass rate counts)")

FAILURE_FIELDS = (
    _field("failure_reason", pa.string(), "why the grading did not pass (FailureReason); null when it passed"),
    _field("failure_detail", pa.string(), "one line: the failing test and its message, the missing module, the "
           "limit hit; empty when it passed"),
)

TIMINGS = pa.struct(
    [
        ("generate_s", pa.float64()),  # the sample's share of its batch's generation
        ("queue_s", pa.float64()),  # from the sandbox pool taking the sample until the grading that counted began
        ("exec_s", pa.float64()),  # the grading command in the sandbox
        ("verify_s", pa.float64()),  # the whole grading: sandbox set-up, tests, report parsing
    ]
)

TRAJECTORIES = pa.schema(
    [
        _field("task_id", pa.string(), "task identifier", nullable=False),
        _field("task_version", pa.string(), "content hash of the task the sample answered"),
        _field("split", pa.string(), "train or eval"),
        _field("difficulty", pa.string(), "easy, medium or hard"),
        _field("family", pa.string(), "task family (generator template)"),
        _field("group_id", pa.string(), "samples of one prompt share a group (GRPO baseline)"),
        _field("sample_index", pa.int32(), "index of the sample within its group"),
        _field("policy_version", pa.string(), "content hash of the checkpoint that sampled"),
        _field("policy_iteration", pa.int32(), "the iteration whose checkpoint sampled (0: the base policy); null "
               "outside an iteration (a model evaluation)"),
        _field("staleness", pa.int32(), "training steps between the checkpoint that sampled and the one the "
               "iteration trains from (its previous): 0 unless the experiment's max_staleness lets it sample an older "
               "one; null outside an iteration"),
        _field("prompt_token_ids", pa.list_(pa.int32()), "prompt as token ids"),
        _field("response_token_ids", pa.list_(pa.int32()), "sampled token ids, stop token included"),
        _field("loss_mask", pa.list_(pa.int8()), "1 for tokens the policy produced, 0 otherwise"),
        _field("behaviour_logprobs", pa.list_(pa.float32()), "log-prob of each sampled token; null where the engine "
               "returned none (a text-only HTTP server): such rows are evaluated, never trained on"),
        _field("response_text", pa.string(), "decoded response"),
        _field("turns", pa.list_(TURN), "the episode turn by turn (reply, action, status, exit code, "
               "observation, timings); a single-turn sample has one, its submission, whose detail says how its "
               "solution was found in the reply (an ExtractionMethod, training/agent/extraction.py) and whose status "
               "is error when the reply held nothing to submit"),
        _field("patch", pa.string(), "the submission: solution.py's code, or a repository task's diff"),
        _field("test_results", pa.list_(TEST_RESULT), "per hidden test outcome"),
        _field("reward_components", pa.map_(pa.string(), pa.float64()), "named reward terms"),
        _field("reward", pa.float64(), "scalar reward; null unless reward_status is scored"),
        _field("reward_status", pa.string(), "whether `reward` means anything (RewardStatus)"),
        _field("reward_version", pa.string(), "the reward function that set `reward`: name@hash of its weights"),
        _field("passed", pa.bool_(), PASSED_DOC),
        _field("tamper_flags", pa.list_(pa.string()), "signs the submission gamed the grader (TamperFlag)"),
        *FAILURE_FIELDS,
        _field("exec_status", pa.string(), "what the grading run's command did (ExecStatus)"),
        _field("timings", TIMINGS, "seconds per phase: generate_s (its share of the batch's generation), "
               "queue_s (waiting for a sandbox slot), exec_s (the grading command), verify_s (the whole grading)"),
        _field("prompt_tokens", pa.int32(), "tokens of the rendered prompt (system message and task)"),
        _field("sampled_tokens", pa.int32(), "tokens the policy sampled (the sum of loss_mask)"),
        _field("observation_tokens", pa.int32(), "tokens of the response the policy did not sample: an episode's "
               "observations and the chat template's turn markers between replies (0 for a single reply)"),
        _field("finish_reason", pa.string(), "how the sample ended (FinishReason)"),
        _field("error_class", pa.string(), "exception class of an infrastructure error, else null"),
        _field("sandbox_backend", pa.string(), "sandbox backend that graded the sample"),
        _field("sandbox_spec_hash", pa.string(), "hash of the SandboxSpec used for grading"),
        _field("environment", pa.string(), "digest of the task's built environment (environments/); null: the "
               "sandbox image as it is"),
    ]
)

EVALUATIONS = pa.schema(
    [
        _field("task_id", pa.string(), "held-out task identifier", nullable=False),
        _field("sample_index", pa.int32(), "which of the task's samples (0 when evaluated greedily)"),
        _field("difficulty", pa.string(), "easy, medium or hard"),
        _field("family", pa.string(), "task family"),
        _field("policy_version", pa.string(), "content hash of the evaluated checkpoint"),
        _field("response_text", pa.string(), "the policy's answer"),
        _field("reward", pa.float64(), "scalar reward; null unless reward_status is scored"),
        _field("passed", pa.bool_(), PASSED_DOC),
        _field("reward_status", pa.string(), "whether `reward` means anything (RewardStatus)"),
        _field("reward_version", pa.string(), "the reward function that set `reward`: name@hash of its weights"),
        _field("observations", pa.string(), "what the policy was shown after each action (Observations); null in "
               "data stored before schema 9, which was shown"),
        _field("turns", pa.list_(TURN), "the episode turn by turn, as in trajectories (the observation stored is "
               "what the action answered, also when the policy was shown it blanked)"),
    ]
)

TASKS = pa.schema(
    [
        _field("task_id", pa.string(), "task identifier", nullable=False),
        _field("task_version", pa.string(), "content hash of the task (prompt, files, tests, limits)"),
        _field("task_set", pa.string(), "the task set it belongs to"),
        _field("task_set_version", pa.string(), "content hash over the set's task versions"),
        _field("kind", pa.string(), "function or repository"),
        _field("split", pa.string(), "train or eval"),
        _field("difficulty", pa.string(), "easy, medium or hard"),
        _field("family", pa.string(), "task family (generator template)"),
        _field("domain", pa.string(), "what kind of work the task is"),
        _field("prompt", pa.string(), "what the policy is asked (hidden tests and reference stay out)"),
        _field("starting_files", pa.list_(pa.string()), "paths of the workspace the task starts from"),
        _field("network", pa.bool_(), "whether its sandbox may reach the network"),
        _field("wall_s", pa.float64(), "wall-clock limit of one grading run, seconds"),
        _field("sampled", pa.bool_(), "whether this iteration sampled it"),
    ]
)

STAGES = pa.schema(
    [
        _field("stage", pa.string(), "asset that ran: rollouts, verified_rollouts, …", nullable=False),
        _field("seconds", pa.float64(), "wall-clock seconds of the stage"),
        _field("started_at", pa.timestamp("us", tz="UTC"), "when the stage started"),
    ]
)

CHECKPOINTS = pa.schema(
    [
        _field("path", pa.string(), "checkpoint directory (Hugging Face format)", nullable=False),
        _field("content_hash", pa.string(), "hash over every file of the checkpoint"),
        _field("parent_path", pa.string(), "checkpoint the step started from"),
        _field("parent_hash", pa.string(), "content hash of the parent"),
        _field("trajectories", pa.list_(pa.string()), "trajectory partitions the step trained on"),
        _field("samplers", pa.list_(pa.struct([("iteration", pa.int32()), ("content_hash", pa.string())])),
               "the checkpoints that sampled those trajectories (iteration, content hash): the parent, or older "
               "ones within the experiment's max_staleness"),
        _field("task_set_version", pa.string(), "version of the task set the samples answered"),
        _field("config_hash", pa.string(), "sha256 of the experiment's settings"),
        _field("code_version", pa.string(), "crucible version and hash of the training and grading source"),
        _field("global_step", pa.int64(), "optimizer steps since the base policy"),
        _field("loss", pa.float64(), "mean policy loss of the step"),
        _field("final_kl", pa.float64(), "KL(sampling policy || the saved one) per trained token (k3), measured "
               "after the last optimizer step: what training_not_diverged judges"),
        _field("mean_step_kl", pa.float64(), "training_steps.approx_kl averaged over the step's tokens (each "
               "measured before its optimizer step)"),
        _field("kl_to_reference", pa.float64(), "KL estimate to the frozen reference (null without a KL penalty: no reference is measured)"),
        _field("entropy", pa.float64(), "mean next-token entropy on the trained tokens, nats"),
        _field("clip_fraction", pa.float64(), "fraction of tokens whose ratio was clipped"),
        _field("grad_norm", pa.float64(), "mean gradient norm before clipping"),
        _field("grad_norm_max", pa.float64(), "largest gradient norm before clipping"),
        _field("sampled_tokens", pa.float64(), "mean tokens the policy sampled per sample (iteration_rewards)"),
        _field("zero_variance_fraction", pa.float64(), "share of groups without a learning signal "
               "(iteration_rewards, datastore/metrics.py)"),
        _field("reward_mean", pa.float64(), "mean reward of the scored samples (iteration_rewards)"),
        _field("reward_std", pa.float64(), "sample standard deviation of those rewards (iteration_rewards)"),
        _field("tamper_rate", pa.float64(), "share of samples with a tamper flag (iteration_rewards)"),
        _field("train_tokens", pa.int64(), "tokens through forward and backward (prompt + response, padded)"),
        _field("tokens_per_s", pa.float64(), "training throughput"),
        _field("logprob_mismatch", pa.list_(pa.struct([
            ("group_id", pa.string()), ("sample_index", pa.int32()), ("tokens", pa.int32()),
            ("mean_diff", pa.float64()), ("mean_abs_diff", pa.float64()), ("max_abs_diff", pa.float64()),
            ("max_at", pa.int32()), ("max_token", pa.string())])),
               "per trained sample, the trainer's log-prob of each sampled token at the step's starting weights "
               "minus the sampler's (training/rl/mismatch.py): mean, mean absolute, the largest absolute and the "
               "token and position it is at; null where the step trained no sample"),
        _field("blocked", pa.bool_(), "a stability check failed: no iteration may sample from this checkpoint"),
        _field("monitor_messages", pa.list_(pa.string()), "every stability check: name, verdict, detail"),
    ]
)

TRAINING_STEPS = pa.schema(
    [
        _field("step", pa.int32(), "optimizer step within the iteration, from 1", nullable=False),
        _field("loss", pa.float64(), "policy loss of the minibatch"),
        _field("clip_fraction", pa.float64(), "fraction of tokens whose ratio was clipped"),
        _field("approx_kl", pa.float64(), "KL(sampling policy || the current one) per token (k3), before this "
               "optimizer step updated it"),
        _field("kl_to_reference", pa.float64(), "KL estimate to the frozen reference (null without a KL penalty)"),
        _field("entropy", pa.float64(), "mean next-token entropy on the trained tokens, nats"),
        _field("grad_norm", pa.float64(), "gradient norm before clipping"),
        _field("lr", pa.float64(), "learning rate of the step"),
        _field("tokens", pa.int64(), "tokens through forward and backward"),
    ]
)

# One part per reward version (`<dataset>/experiment=…/iteration=…/<reward_version>…`), so
# re-gradings with different verifiers stand side by side and the trajectories stay as trained on.
REGRADES = pa.schema(
    [
        _field("task_id", pa.string(), "task identifier", nullable=False),
        _field("group_id", pa.string(), "with sample_index, the trajectory row re-graded"),
        _field("sample_index", pa.int32(), "index of the sample within its group"),
        _field("task_version", pa.string(), "content hash of the task as re-graded (it may have changed since)"),
        _field("trajectory_file", pa.string(), "the trajectory file the submission was read from"),
        _field("original_reward", pa.float64(), "the reward that row was trained with"),
        _field("original_passed", pa.bool_(), "its verdict then"),
        _field("original_reward_version", pa.string(), "the reward function that set it"),
        _field("reward", pa.float64(), "scalar reward; null unless reward_status is scored"),
        _field("reward_status", pa.string(), "whether `reward` means anything (RewardStatus)"),
        _field("reward_version", pa.string(), "the reward function of this re-grading: name@hash of its weights"),
        _field("passed", pa.bool_(), PASSED_DOC),
        _field("tamper_flags", pa.list_(pa.string()), "signs the submission gamed the grader (TamperFlag)"),
        *FAILURE_FIELDS,
        _field("exec_status", pa.string(), "what the grading run's command did (ExecStatus)"),
        _field("test_results", pa.list_(TEST_RESULT), "per hidden test outcome"),
        _field("code_version", pa.string(), "crucible version and hash of the grading source that re-graded"),
        _field("regraded_at", pa.timestamp("us", tz="UTC"), "when"),
    ]
)

# One part per asset (`…/<asset>.manifest.json`): what an iteration asset handed the next, so any
# asset can be re-materialized alone (assets/io_manager.py).
OUTPUTS = pa.schema(
    [
        _field("index", pa.int32(), "position in the asset's list", nullable=False),
        _field("record", pa.string(), "the item as JSON, in the Python type the asset declares"),
    ]
)

# `crucible eval`: a model's answers to a task set's held-out tasks, graded, without training it.
# `experiment` holds the evaluation's name; its one partition is iteration 0.
MODEL_EVALUATIONS = pa.schema(
    [
        _field("model", pa.string(), "the evaluated model: a directory, or the name a server answers to"),
        _field("task_set", pa.string(), "the task set the task belongs to"),
        _field("domain", pa.string(), "the task's domain (python-functions, python-repositories, …)"),
        *TRAJECTORIES,
    ]
)

DATASETS: dict[str, pa.Schema] = {
    "trajectories": TRAJECTORIES,
    "evaluations": EVALUATIONS,
    # An evaluation's chunks as each is graded (part: observations-chunk), before `evaluations` has
    # them all: what a stopped evaluation finished, which the next one of that checkpoint keeps.
    "evaluation_chunks": EVALUATIONS,
    "tasks": TASKS,
    "stages": STAGES,
    "checkpoints": CHECKPOINTS,
    "training_steps": TRAINING_STEPS,
    "regrades": REGRADES,
    "outputs": OUTPUTS,
    "model_evaluations": MODEL_EVALUATIONS,
}
# The asset that writes each iteration's part of a dataset (`stages` and `outputs`: the asset the
# part is named after; `model_evaluations`: `crucible eval`, no asset).
WRITTEN_BY = {"trajectories": "trajectories", "evaluations": "checkpoint_eval", "evaluation_chunks": "checkpoint_eval",
              "tasks": "task_set", "checkpoints": "checkpoint", "training_steps": "checkpoint", "regrades": "regrades"}


# Columns whose values come from a closed set (dotted: a field of a list's structs); a write with
# any other value is refused (`unknown_value`).
CLOSED_SETS: dict[str, dict[str, type[ClosedSet]]] = {
    "trajectories": {"reward_status": RewardStatus, "tamper_flags": TamperFlag, "exec_status": ExecStatus,
                     "test_results.outcome": Outcome, "failure_reason": FailureReason,
                     "finish_reason": FinishReason},
    "evaluations": {"reward_status": RewardStatus, "observations": Observations},
    "evaluation_chunks": {"reward_status": RewardStatus, "observations": Observations},
    "model_evaluations": {"reward_status": RewardStatus, "tamper_flags": TamperFlag, "exec_status": ExecStatus,
                          "test_results.outcome": Outcome, "failure_reason": FailureReason,
                          "finish_reason": FinishReason},
    "regrades": {"reward_status": RewardStatus, "tamper_flags": TamperFlag, "exec_status": ExecStatus,
                 "test_results.outcome": Outcome, "failure_reason": FailureReason},
}


def unknown_value(dataset: str, table: pa.Table) -> str | None:
    """Why `table` may not be written to `dataset`: a value outside a column's closed set."""
    for path, closed in CLOSED_SETS.get(dataset, {}).items():
        values = pc.drop_null(_leaf_values(table, path))
        unknown = pc.filter(values, pc.invert(pc.is_in(values, value_set=pa.array(closed.values()))))
        if len(unknown):
            return (f"{dataset}: column {path}: {unknown[0].as_py()!r} is not a {closed.__name__} "
                    f"(one of {', '.join(closed.values())})")
    return None


def _leaf_values(table: pa.Table, path: str) -> pa.Array:
    column, _, field = path.partition(".")
    values = table[column].combine_chunks()
    if pa.types.is_list(values.type):
        values = pc.list_flatten(values)
    return pc.struct_field(values, field) if field else values


def schema_markdown() -> str:
    """docs/schema.md: every dataset's columns, types and meaning (`python -m datastore.schema`)."""
    lines = [f"# Stored datasets, schema version {SCHEMA_VERSION}", "",
             "Generated from `datastore/schema.py` by `python -m datastore.schema > docs/schema.md`; a test "
             "keeps the two in step.", "",
             "Every dataset is hive-partitioned: `<dataset>/experiment=<name>/iteration=<n>/`, and readers "
             "get `experiment` (string) and `iteration` (integer) as columns from those directory names. "
             "Files are Parquet with zstd compression and row groups of up to 64,000 rows; each file's "
             "metadata carries `crucible_schema_version`, and so does each partition's manifest.", ""]
    for name, schema in DATASETS.items():
        lines += [f"## `{name}`", "", "| column | type | meaning |", "|---|---|---|"]
        lines += [f"| `{field.name}` | `{field.type}` | {field.metadata[b'doc'].decode()} |" for field in schema]
        lines.append("")
    lines += ["## Closed status sets", "",
              "A write with any other value in these columns is refused.", ""]
    for closed in sorted({c for columns in CLOSED_SETS.values() for c in columns.values()}, key=lambda c: c.__name__):
        used = ", ".join(f"`{dataset}.{path}`" for dataset, columns in CLOSED_SETS.items()
                         for path, c in columns.items() if c is closed)
        lines += [f"### `{closed.__name__}` ({used})", "", " ".join(closed.__doc__.split("\n\n")[0].split()), "",
                  "| value | meaning |", "|---|---|"]
        lines += [f"| `{member.value}` | {member.meaning} |" for member in closed]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(schema_markdown(), end="")
