"""Reward analytics, computed by DuckDB over the stored trajectories (the views of
datastore/metrics.py, where every measure is defined):

- `iteration_rewards`, per iteration, between its trajectories and its training step: per-task
  table, reward distribution, tamper flags, and the sample monitors as asset checks, whose
  errors stop the training step (training/evaluation/monitors.py);
- `reward_analytics`, across every iteration of every experiment: the table, the reward curve
  and the pass rate by difficulty.
"""

from dagster import (
    AssetCheckSpec,
    AssetExecutionContext,
    AutomationCondition,
    Failure,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
)

from assets.failure_policy import failure_policy
from assets.iteration import ITERATION, check_result, checkpoint_eval, this_iteration, trajectories
from assets.resources import CrucibleResource
from datastore import catalog, metrics
from datastore.charts import (
    difficulty_curve_png,
    figure_png,
    markdown_table,
    png_markdown,
    reward_curve_png,
    reward_histogram_png,
    significant,
    training_figure,
)
from training.evaluation.monitors import SAMPLE_CHECKS, judge_samples

ITERATION_MEASURES = ("tasks", "samples", "scored", "pass_rate", "reward_mean", "reward_std", "reward_p10", "reward_p50",
                      "reward_p90", "zero_variance_fraction", "infra_error_rate", "env_error_rate", "invalid_rate",
                      "truncation_rate", "tamper_rate", "generate_s", "sandbox_s", "prompt_tokens", "sampled_tokens",
                      "observation_tokens", "total_sampled_tokens")
EPISODE_MEASURES = ("turns_per_episode", "runs_per_episode", "submitted_share", "ran_before_submitting_share",
                    "checked_last_edit_share", "wasted_turn_share", "malformed_turn_share", "repeated_command_share")
TASK_COLUMNS = ("task_id", "family", "difficulty", "samples", "pass_rate", "reward_mean", "reward_std",
                "zero_variance_groups", "infra_error_rate", "truncation_rate", "tamper_rate", "generate_s",
                "sandbox_s", "sampled_tokens", "observation_tokens")
SUMMARY_COLUMNS = ("experiment", "iteration", "samples", "pass_rate", "reward_mean", "reward_std",
                   "zero_variance_fraction", "infra_error_rate", "truncation_rate", "tamper_rate", "generate_s",
                   "sandbox_s", "sampled_tokens", "eval_pass_rate", "eval_stderr")


def _check_description(measure: str, limit: str, severity: str) -> str:
    consequence = "the training step does not run" if severity == "error" else "a warning"
    return f"{measure} at most monitors.{limit}; above it, {consequence}"


@asset(
    **ITERATION, deps=[trajectories], kinds={"duckdb"},
    check_specs=[AssetCheckSpec(name, asset="iteration_rewards", blocking=severity == "error",
                                description=_check_description(measure, limit, severity))
                 for name, (measure, limit, severity) in SAMPLE_CHECKS.items()],
)
def iteration_rewards(context: AssetExecutionContext, crucible: CrucibleResource) -> MaterializeResult:
    """This iteration's rewards per task and overall: pass rate, reward distribution, zero-variance
    groups, infrastructure errors, truncation, tamper flags, sandbox and generation time, tokens;
    and its episodes turn by turn: turns, runs before submitting, wasted turns, pass rate by
    number of turns, the commonest failures the commands printed."""
    iteration = this_iteration(context, crucible)
    experiment, where = iteration.experiment, [iteration.name, iteration.number]
    with failure_policy(crucible.store()):
        con = catalog.connect(crucible.storage_root)
        found = metrics.of_iteration(con, "iteration_rewards", *where)
        if not found:
            raise Failure(f"no trajectories stored for {experiment.name} iteration {iteration.number}")
        [stats] = found
        tasks = metrics.of_iteration(con, "task_rewards", *where, order_by="pass_rate, task_id")
        rewards = metrics.scored_rewards(con, *where)
        flags = metrics.tamper_flags(con, *where)
        [episodes] = metrics.of_iteration(con, "turn_analytics", *where)
        by_turns = metrics.of_iteration(con, "pass_rate_by_turns", *where, order_by="turns")
        failures = metrics.of_iteration(con, "failing_observations", *where, order_by="runs DESC, failure", limit=10)
    verdicts = judge_samples(stats, experiment.monitors)
    if stats["scored"]:
        scored = f"pass rate {stats['pass_rate']:.3f}, reward {stats['reward_mean']:.3f} ± {stats['reward_std']:.3f}"
    else:
        scored = "no sample scored"
    context.log.info(f"rewards: {scored}; zero-variance groups "
                     f"{stats['zero_variance_fraction']:.0%}, infra errors {stats['infra_error_rate']:.0%}, "
                     f"truncated {stats['truncation_rate']:.0%}, tampered {stats['tamper_rate']:.0%}")
    for verdict in verdicts:
        if not verdict.passed:
            context.log.warning(f"{verdict.check}: {verdict.message}")
    return MaterializeResult(
        metadata={
            # Plain numbers: the UI plots each across the iterations' partitions.
            **{name: MetadataValue.null() if stats[name] is None else _plain(stats[name]) for name in ITERATION_MEASURES},
            "tasks_table": table_metadata(tasks, TASK_COLUMNS),
            "reward_distribution": MetadataValue.md(png_markdown("reward distribution", reward_histogram_png(
                rewards, f"{experiment.name} iteration {iteration.number}: reward per sample"))),
            "tamper_flags": table_metadata(flags, ("flag", "samples")),
            **{f"episodes/{name}": MetadataValue.null() if episodes[name] is None else _plain(episodes[name])
               for name in EPISODE_MEASURES},
            "pass_rate_by_turns": table_metadata(by_turns, ("turns", "episodes", "pass_rate")),
            "failing_observations": table_metadata(failures, ("failure", "runs")),
        },
        check_results=[check_result(v) for v in verdicts],
    )


# Kept current by declarative automation (pipelines/sensors.py): refreshed once an iteration's
# trajectories or evaluation change, whoever launched it.
@asset(group_name="analytics", deps=[trajectories, checkpoint_eval], kinds={"duckdb"},
       automation_condition=AutomationCondition.any_deps_updated() & ~AutomationCondition.in_progress())
def reward_analytics(context: AssetExecutionContext, crucible: CrucibleResource) -> MaterializeResult:
    """Every iteration of every experiment: reward analytics beside the held-out evaluation, the
    reward curve, and the pass rate by difficulty."""
    with failure_policy(crucible.store()):
        con = catalog.connect(crucible.storage_root)
        # Iteration 0 (the base policy) has an evaluation but no samples.
        rows = metrics.rewards_beside_evaluation(con)
        by_difficulty = metrics.every_iteration(con, "difficulty_rewards")
        every = metrics.every_iteration(con, "iterations")
    context.log.info(f"{len(rows)} iterations summarised")
    per_experiment = {}
    for experiment in sorted({row["experiment"] for row in every}):
        mine = [row for row in every if row["experiment"] == experiment]
        # The summary is short enough for the UI to show inline; the figure opens from its button.
        per_experiment[f"{experiment}/latest"] = MetadataValue.md(latest_summary(experiment, mine))
        per_experiment[f"{experiment}/training"] = MetadataValue.md(
            png_markdown(f"{experiment}: how training goes", figure_png(training_figure(experiment, mine))))
    return MaterializeResult(
        metadata={
            **per_experiment,
            "iterations": len(rows),
            "summary": table_metadata(rows, SUMMARY_COLUMNS),
            "reward_curve": MetadataValue.md(png_markdown("reward curve", reward_curve_png(rows))),
            "pass_rate_by_difficulty": MetadataValue.md(
                png_markdown("pass rate by difficulty", difficulty_curve_png(by_difficulty))),
        }
    )


# (label, iterations-view column, how a value reads) of the latest-iteration summary.
LATEST = (("held-out pass rate", "eval_pass_rate", ".3f"), ("train pass rate", "pass_rate", ".3f"), ("mean reward", "reward_mean", ".3f"),
          ("KL, mean over the steps", "mean_step_kl", ".3g"), ("entropy", "entropy", ".3g"),
          ("sampled tokens per sample", "sampled_tokens", ".1f"), ("held-out blanked", "eval_blanked_pass_rate", ".3f"))


def latest_summary(experiment: str, rows: list[dict]) -> str:
    """The experiment's latest iteration in a few lines of Markdown: held-out pass rate against
    the base policy, and each measure beside its change since the iteration before."""
    last = rows[-1]
    before = rows[-2] if len(rows) > 1 else {}
    lines = [f"**{experiment}**, iteration {last['iteration']}"]
    if last["eval_pass_rate"] is not None:
        lines.append(f"held-out {last['eval_pass_rate']:.3f} ± {last['eval_stderr']:.3f}"
                     + ("" if last["eval_improvement"] is None else
                        f", {last['eval_improvement']:+.3f} ± {last['eval_improvement_stderr']:.3f} over the base"))
    table = [{"measure": label, "now": _reading(last.get(column), spec),
              "change": _change(last.get(column), before.get(column), spec)} for label, column, spec in LATEST]
    return "\n\n".join(lines) + "\n\n" + markdown_table(table, ("measure", "now", "change"))


def _reading(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _change(now, before, spec: str) -> str:
    return "" if now is None or before is None else format(now - before, "+" + spec)


def table_metadata(rows: list[dict], columns: tuple[str, ...]) -> MetadataValue:
    """A table the Dagster UI shows as one (sortable), typed from the values."""
    def kind(name: str) -> str:
        value = next((row[name] for row in rows if row[name] is not None), "")
        return {bool: "bool", int: "int", float: "float"}.get(type(value), "string")

    schema = TableSchema(columns=[TableColumn(name, kind(name)) for name in columns])
    records = [TableRecord({name: _plain(row[name]) for name in columns}) for row in rows]
    return MetadataValue.table(records, schema)


def _plain(value):
    """Table cells take str, int, float and bool: floats to three significant digits, nulls to ''."""
    if value is None:
        return ""
    return significant(value) if isinstance(value, float) else value
