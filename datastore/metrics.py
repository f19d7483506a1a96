"""Every number Crucible reports about samples, defined once, as DuckDB SQL over the stored columns.

The catalog (datastore/catalog.py) makes these views; the assets' metadata, the sample and
stability monitors, the run summary and `crucible curve` all read them, so a monitor, a stored
value and an analyst's query can never disagree. The functions at the end (`of_iteration`, `curve`,
`optimizer_steps` and the others) are every query the product runs over them, on a connection the
catalog opened.

Definitions:
- A sample counts towards a pass rate only if it was scored: an infrastructure error, an
  environment that cannot run the tests or a broken task (reward_status infra_error, env_error or
  invalid) is kept apart, as its own rate, never counted as a failure. `passed` itself is GradeResult.passed (grading/verdict.py).
- `reward_mean`, `reward_std` (sample standard deviation): over scored samples (reward is null
  otherwise).
- A group (the samples of one prompt) carries a learning signal when at least two of its samples
  were scored with different rewards; every other group is a zero-variance group.
- Held-out pass rate: tasks are the unit, and only the evaluation with observations shown counts
  (the blanked one is `feedback_value`'s). A task's pass rate is the share of its scored samples
  that passed; the pass rate is the mean over tasks, its standard error the spread of the task
  rates over sqrt(tasks), so that repeated samples of one task never count as independent
  evidence. The improvement over the base policy (iteration 0) is paired by task: the mean of the
  per-task differences over the tasks both evaluated, with the standard error of those
  differences.
- The value of execution feedback (`feedback_value`): the same checkpoint's held-out episodes
  with observations shown and blanked (the commands run, their output hidden from the policy),
  paired by task: the mean of the per-task differences of pass rates and its standard error.
- Episodes (`episodes`, one row per trajectory; `turn_analytics` per iteration): turns, runs and
  edits; whether it ran a command before submitting; whether its last edit was followed by a run
  (it checked its fix; null without an edit); wasted turns: malformed actions, and runs of the same command as the turn
  right before (nothing changed in between, so nothing new to read). `pass_rate_by_turns` is the
  pass rate of scored episodes by their number of turns; `failing_observations` counts the
  failures commands printed, normalised (a traceback by its last line, anything else by its first;
  numbers and quoted strings masked) so that one kind of failure is one row.
- A model evaluation (`crucible eval`, the model_evaluations dataset) is reported the same way:
  pass rates are means over tasks with that standard error, per task set and per domain and
  difficulty within it. Its stability is the agreement of a task's repeated samples: the share
  of pairs of its scored samples with the same verdict (1 when every run agrees), averaged over
  the tasks scored at least twice. Its cost is per solution (a passing sample): the prompt,
  sampled and observation tokens and the sandbox seconds spent on every sample, over the samples
  that passed.
- Tokens are kept apart by who wrote them: `prompt_tokens` (the rendered prompt), `sampled_tokens`
  (what the policy sampled: its generation, and all it is trained on) and `observation_tokens`
  (what the environment answered between its replies). Per-sample means carry the bare names,
  an iteration's sums `total_…`. `truncation_rate` is the share of samples a token budget cut
  short (finish_reason length or max_tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb

from datastore.schema import TRUNCATED

SCORED = "reward_status = 'scored'"
TRUNCATED_SQL = ", ".join(f"'{reason}'" for reason in TRUNCATED)
SHOWN = "coalesce(observations, 'shown') = 'shown'"  # evaluations stored before schema 9 were shown

# Over samples carrying `flat_group` (SAMPLES_WITH_GROUP_FLAG). A sample's sandbox time is its
# grading (set-up, tests, parsing) plus the commands its episode ran.
SAMPLE_MEASURES = f"""
    count(*) AS samples,
    count(*) FILTER (WHERE {SCORED}) AS scored,
    avg(passed::INT) FILTER (WHERE {SCORED}) AS pass_rate,
    avg(reward) AS reward_mean,
    coalesce(stddev_samp(reward), 0) AS reward_std,
    count(DISTINCT group_id) AS groups,
    count(DISTINCT group_id) FILTER (WHERE flat_group) AS zero_variance_groups,
    avg((reward_status = 'infra_error')::INT) AS infra_error_rate,
    avg((reward_status = 'env_error')::INT) AS env_error_rate,
    avg((reward_status = 'invalid')::INT) AS invalid_rate,
    avg((finish_reason IN ({TRUNCATED_SQL}))::INT) AS truncation_rate,
    avg((len(tamper_flags) > 0)::INT) AS tamper_rate,
    avg(timings.generate_s) AS generate_s,
    avg(timings.verify_s + coalesce(list_sum([t.exec_s FOR t IN turns]), 0)) AS sandbox_s,
    avg(prompt_tokens) AS prompt_tokens,
    avg(sampled_tokens) AS sampled_tokens,
    avg(observation_tokens) AS observation_tokens
"""
# What a failed command printed, in one line: a traceback's last line, else the first.
FAILURE_LINE = "CASE WHEN output[1] LIKE 'Traceback%' THEN output[-1] ELSE coalesce(output[1], '(no output)') END"


def masked(line: str) -> str:
    """`line` (SQL) with its numbers and quoted strings masked: one kind of failure, whatever its values."""
    return rf"""regexp_replace(regexp_replace({line}, '''[^'']*''', '''_''', 'g'), '-?[0-9]+', '#', 'g')"""


SAMPLES_WITH_GROUP_FLAG = """
    (SELECT *, coalesce(max(reward) OVER g = min(reward) OVER g, true) AS flat_group
     FROM trajectories WINDOW g AS (PARTITION BY experiment, iteration, group_id))
"""

METRIC_VIEWS = {
    "task_rewards": f"""
        SELECT experiment, iteration, task_id, any_value(family) AS family,
               any_value(difficulty) AS difficulty, {SAMPLE_MEASURES}
        FROM {SAMPLES_WITH_GROUP_FLAG} GROUP BY experiment, iteration, task_id
    """,
    "difficulty_rewards": f"""
        SELECT experiment, iteration, difficulty, {SAMPLE_MEASURES}
        FROM {SAMPLES_WITH_GROUP_FLAG} GROUP BY experiment, iteration, difficulty
    """,
    # Samples stored before rows named their sampler were sampled by the previous checkpoint.
    "staleness_rewards": f"""
        SELECT experiment, iteration, coalesce(staleness, 0) AS staleness, {SAMPLE_MEASURES}
        FROM {SAMPLES_WITH_GROUP_FLAG} GROUP BY experiment, iteration, coalesce(staleness, 0)
    """,
    # The trainer's log-probs against the sampler's, per trained sample (training/rl/mismatch.py),
    # with the sample's task and staleness; every step that trains measures them.
    "logprob_mismatch": """
        WITH measured AS (
            SELECT experiment, iteration, unnest(logprob_mismatch, recursive := true) FROM checkpoints
        )
        SELECT m.experiment, m.iteration, t.task_id, m.group_id, m.sample_index, coalesce(t.staleness, 0) AS staleness,
               m.tokens, m.mean_diff, m.mean_abs_diff, m.max_abs_diff, m.max_at, m.max_token
        FROM measured m
        LEFT JOIN trajectories t USING (experiment, iteration, group_id, sample_index)
    """,
    "logprob_mismatch_by_staleness": """
        SELECT experiment, iteration, staleness, count(*) AS samples, sum(tokens)::BIGINT AS tokens,
               sum(mean_diff * tokens) / sum(tokens) AS mean_diff,
               sum(mean_abs_diff * tokens) / sum(tokens) AS mean_abs_diff, max(max_abs_diff) AS max_abs_diff
        FROM logprob_mismatch GROUP BY experiment, iteration, staleness
    """,
    "iteration_rewards": f"""
        SELECT experiment, iteration, count(DISTINCT task_id) AS tasks, {SAMPLE_MEASURES},
               zero_variance_groups / groups AS zero_variance_fraction,
               quantile_cont(reward, 0.1) AS reward_p10, median(reward) AS reward_p50,
               quantile_cont(reward, 0.9) AS reward_p90,
               sum(prompt_tokens)::BIGINT AS total_prompt_tokens, sum(sampled_tokens)::BIGINT AS total_sampled_tokens,
               sum(observation_tokens)::BIGINT AS total_observation_tokens
        FROM {SAMPLES_WITH_GROUP_FLAG} GROUP BY experiment, iteration
    """,
    "held_out_tasks": f"""
        SELECT experiment, iteration, task_id, any_value(difficulty) AS difficulty, count(*) AS samples,
               avg(passed::INT) AS pass_rate
        FROM evaluations WHERE {SCORED} AND {SHOWN} GROUP BY experiment, iteration, task_id
    """,
    "feedback_value": f"""
        WITH per_task AS (
            SELECT experiment, iteration, task_id,
                   avg(passed::INT) FILTER (WHERE {SHOWN}) AS shown,
                   avg(passed::INT) FILTER (WHERE observations = 'blanked') AS blanked
            FROM evaluations WHERE {SCORED} GROUP BY experiment, iteration, task_id
        ),
        summary AS (
            SELECT experiment, iteration, count(*) AS tasks, avg(shown) AS pass_rate,
                   avg(blanked) AS blanked_pass_rate,
                   coalesce(stddev_samp(blanked) / sqrt(count(*)), 0) AS blanked_stderr,
                   avg(shown - blanked) AS feedback_gap,
                   coalesce(stddev_samp(shown - blanked) / sqrt(count(*)), 0) AS feedback_gap_stderr
            FROM per_task WHERE shown IS NOT NULL AND blanked IS NOT NULL GROUP BY experiment, iteration
        )
        SELECT *,
               CASE WHEN feedback_gap_stderr > 0 THEN feedback_gap / feedback_gap_stderr
                    WHEN feedback_gap = 0 THEN 0.0
                    ELSE sign(feedback_gap) * 'inf'::DOUBLE END AS feedback_gap_in_stderrs
        FROM summary
    """,
    "held_out": """
        WITH paired AS (
            SELECT t.*, t.pass_rate - base.pass_rate AS gain
            FROM held_out_tasks t
            LEFT JOIN (SELECT experiment, task_id, pass_rate FROM held_out_tasks WHERE iteration = 0) base
            USING (experiment, task_id)
        ),
        summary AS (
            SELECT experiment, iteration, count(*) AS tasks, sum(samples)::BIGINT AS samples,
                   avg(pass_rate) AS pass_rate,
                   coalesce(stddev_samp(pass_rate) / sqrt(count(*)), 0) AS stderr,
                   count(gain) AS paired_tasks, avg(gain) AS improvement,
                   coalesce(stddev_samp(gain) / sqrt(count(gain)), 0) AS improvement_stderr
            FROM paired GROUP BY experiment, iteration
        )
        SELECT *,
               -- +-inf when every paired task moved by the same non-zero amount (one paired task included)
               CASE WHEN improvement_stderr > 0 THEN improvement / improvement_stderr
                    WHEN improvement = 0 THEN 0.0
                    ELSE sign(improvement) * 'inf'::DOUBLE END AS improvement_in_stderrs
        FROM summary
    """,
    "episodes": """
        SELECT experiment, iteration, task_id, family, difficulty, group_id, sample_index, passed, reward_status,
               finish_reason, len(turns) AS turns,
               len(list_filter(turns, lambda t: t.action = 'run')) AS runs,
               len(list_filter(turns, lambda t: t.action IN ('write', 'replace'))) AS edits,
               -- whatever ended an episode (its submit or a limit), its workspace is its submission
               runs > 0 AS ran_before_submitting,
               CASE WHEN edits > 0 THEN coalesce(list_max([t.index FOR t IN turns IF t.action = 'run']), -1)
                         > list_max([t.index FOR t IN turns IF t.action IN ('write', 'replace')]) END
                   AS checked_last_edit,
               len(list_filter(turns, lambda t: t.action = 'malformed')) AS malformed_turns,
               len(list_filter(turns, lambda t, i: i > 1 AND t.action = 'run' AND turns[i - 1].action = 'run'
                                                   AND turns[i - 1].detail = t.detail)) AS repeated_commands
        FROM trajectories
    """,
    "turn_analytics": f"""
        SELECT experiment, iteration, count(*) AS episodes, avg(turns) AS turns_per_episode,
               avg(runs) AS runs_per_episode, avg(edits) AS edits_per_episode,
               avg((finish_reason = 'submitted')::INT) AS submitted_share,
               avg(ran_before_submitting::INT) AS ran_before_submitting_share,
               avg(checked_last_edit::INT) FILTER (WHERE edits > 0) AS checked_last_edit_share,
               sum(malformed_turns + repeated_commands) / sum(turns) AS wasted_turn_share,
               sum(malformed_turns) / sum(turns) AS malformed_turn_share,
               sum(repeated_commands) / sum(turns) AS repeated_command_share,
               avg(passed::INT) FILTER (WHERE {SCORED}) AS pass_rate
        FROM episodes GROUP BY experiment, iteration
    """,
    "pass_rate_by_turns": f"""
        SELECT experiment, iteration, turns, count(*) AS episodes, avg(passed::INT) FILTER (WHERE {SCORED}) AS pass_rate
        FROM episodes GROUP BY experiment, iteration, turns
    """,
    "failing_observations": f"""
        WITH failed AS (
            SELECT experiment, iteration, list_filter(string_split(turn.observation_excerpt, chr(10))[2:],
                                                      lambda line: trim(line) <> '') AS output
            FROM (SELECT experiment, iteration, unnest(turns) AS turn FROM trajectories)
            WHERE turn.action = 'run' AND turn.status = 'error'
        )
        SELECT experiment, iteration, {masked(FAILURE_LINE)} AS failure,
               count(*) AS runs
        FROM failed GROUP BY ALL
    """,
    "model_eval_tasks": f"""
        SELECT experiment AS evaluation, any_value(model) AS model, task_set, domain, difficulty, task_id,
               count(*) AS samples, count(*) FILTER (WHERE {SCORED}) AS scored,
               count(*) FILTER (WHERE {SCORED} AND passed) AS passes, avg(passed::INT) FILTER (WHERE {SCORED}) AS pass_rate
        FROM model_evaluations GROUP BY experiment, task_set, domain, difficulty, task_id
    """,
    "model_eval_pass_rates": """
        SELECT evaluation, any_value(model) AS model, task_set,
               CASE WHEN grouping(domain) = 1 THEN '(all)' ELSE domain END AS domain,
               CASE WHEN grouping(difficulty) = 1 THEN '(all)' ELSE difficulty END AS difficulty,
               count(*) AS tasks, sum(scored)::BIGINT AS samples,
               avg(pass_rate) AS pass_rate, coalesce(stddev_samp(pass_rate) / sqrt(count(*)), 0) AS stderr
        FROM model_eval_tasks WHERE scored > 0
        GROUP BY GROUPING SETS ((evaluation, task_set), (evaluation, task_set, domain),
                                (evaluation, task_set, difficulty))
        ORDER BY evaluation, task_set, domain, difficulty
    """,
    "model_eval_stability": """
        SELECT evaluation, count(*) AS repeated_tasks,
               avg((passes * (passes - 1) + (scored - passes) * (scored - passes - 1)) / (scored * (scored - 1)))
                   AS agreement,
               avg((passes IN (0, scored))::INT) AS unanimous_share
        FROM model_eval_tasks WHERE scored >= 2 GROUP BY evaluation
    """,
    "model_eval_failures": """
        SELECT experiment AS evaluation, 'reward_status' AS kind, reward_status AS value, count(*) AS samples
        FROM model_evaluations GROUP BY ALL
        UNION ALL
        SELECT experiment, 'exec_status', exec_status, count(*) FROM model_evaluations GROUP BY ALL
        UNION ALL
        SELECT experiment, 'tamper_flag', flag, count(*)
        FROM (SELECT experiment, unnest(tamper_flags) AS flag FROM model_evaluations) GROUP BY ALL
        ORDER BY evaluation, kind, samples DESC
    """,
    "model_eval_cost": f"""
        SELECT experiment AS evaluation, count(*) AS samples, count(*) FILTER (WHERE {SCORED} AND passed) AS solutions,
               sum(prompt_tokens)::BIGINT AS prompt_tokens, sum(sampled_tokens)::BIGINT AS sampled_tokens,
               sum(observation_tokens)::BIGINT AS observation_tokens,
               sum(timings.verify_s + coalesce(list_sum([t.exec_s FOR t IN turns]), 0)) AS sandbox_s,
               -- sum() again, not the alias: DuckDB binds a name to the column before the alias
               sum(prompt_tokens) / nullif(solutions, 0) AS prompt_tokens_per_solution,
               sum(sampled_tokens) / nullif(solutions, 0) AS sampled_tokens_per_solution,
               sum(observation_tokens) / nullif(solutions, 0) AS observation_tokens_per_solution,
               sandbox_s / nullif(solutions, 0) AS sandbox_s_per_solution
        FROM model_evaluations GROUP BY experiment
    """,
}


# Reading them: every query the product runs over the views above, on a connection the catalog
# (datastore/catalog.py) opened.


def records(con: duckdb.DuckDBPyConnection, query: str, parameters: Sequence = ()) -> list[dict]:
    """A query's rows as dicts keyed by column name."""
    result = con.execute(query, parameters)
    names = [column[0] for column in result.description]
    return [dict(zip(names, values)) for values in result.fetchall()]


def of_iteration(con: duckdb.DuckDBPyConnection, view: str, experiment: str, iteration: int,
                 order_by: str = "ALL", limit: int | None = None) -> list[dict]:
    """The rows of `view` (one named above, or a dataset) for one iteration."""
    bounded = f" LIMIT {int(limit)}" if limit is not None else ""
    return records(con, f"SELECT * FROM {view} WHERE experiment = ? AND iteration = ? ORDER BY {order_by}{bounded}",
                   [experiment, iteration])


def curve(con: duckdb.DuckDBPyConnection, view: str, experiment: str, through: int | None = None) -> list[dict]:
    """The rows of `view` for iterations 0 to `through` (None: every one) of an experiment, in order."""
    bound = "" if through is None else f" AND iteration <= {int(through)}"
    return records(con, f"SELECT * FROM {view} WHERE experiment = ?{bound} ORDER BY iteration", [experiment])


def every_iteration(con: duckdb.DuckDBPyConnection, view: str) -> list[dict]:
    """The rows of `view` for every iteration of every experiment, in order."""
    return records(con, f"SELECT * FROM {view} ORDER BY experiment, iteration")


def optimizer_steps(con: duckdb.DuckDBPyConnection, experiment: str) -> list[dict]:
    """Every optimizer step of an experiment with its statistics, numbered from the base policy
    (`global_step`): training_steps.step counts an iteration's steps from 1, so its largest is how
    many there were, and checkpoints.global_step is the iteration's last."""
    return records(con, """
        SELECT s.*, c.global_step - max(s.step) OVER (PARTITION BY iteration) + s.step AS global_step
        FROM training_steps s JOIN checkpoints c USING (experiment, iteration)
        WHERE experiment = ? ORDER BY iteration, s.step""", [experiment])


def scored_rewards(con: duckdb.DuckDBPyConnection, experiment: str, iteration: int) -> list[float]:
    """The reward of every scored sample of one iteration."""
    return [reward for (reward,) in con.execute(
        "SELECT reward FROM trajectories WHERE experiment = ? AND iteration = ? AND reward IS NOT NULL",
        [experiment, iteration]).fetchall()]


def tamper_flags(con: duckdb.DuckDBPyConnection, experiment: str, iteration: int) -> list[dict]:
    """How many samples of one iteration raised each tamper flag, the commonest first."""
    return records(con, "SELECT flag, count(*) AS samples FROM (SELECT unnest(tamper_flags) AS flag FROM trajectories "
                   "WHERE experiment = ? AND iteration = ?) GROUP BY flag ORDER BY samples DESC, flag",
                   [experiment, iteration])


def held_out_with_feedback(con: duckdb.DuckDBPyConnection, experiment: str) -> list[dict]:
    """The held-out curve of an experiment with the blanked evaluation beside each iteration that has one."""
    return records(con, """
        SELECT h.*, f.blanked_pass_rate, f.blanked_stderr, f.feedback_gap, f.feedback_gap_stderr,
               f.feedback_gap_in_stderrs
        FROM held_out h LEFT JOIN feedback_value f USING (experiment, iteration)
        WHERE experiment = ? ORDER BY iteration""", [experiment])


def rewards_beside_evaluation(con: duckdb.DuckDBPyConnection) -> list[dict]:
    """Every iteration of every experiment: its reward analytics beside its held-out evaluation
    (iteration 0, the base policy, has an evaluation but no samples)."""
    return records(con, "SELECT i.experiment, i.iteration, r.* EXCLUDE (experiment, iteration), i.eval_pass_rate, "
                   "i.eval_stderr FROM iterations i LEFT JOIN iteration_rewards r USING (experiment, iteration) "
                   "ORDER BY i.experiment, i.iteration")


def stored_experiments(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The experiments in the store, the most recent first: by the start of their latest stage."""
    return [name for (name,) in con.execute(
        "SELECT experiment FROM stages GROUP BY experiment ORDER BY max(started_at) DESC").fetchall()]


def model_evaluation(con: duckdb.DuckDBPyConnection, view: str, evaluation: str) -> list[dict]:
    """The rows of one of the model_eval_* views for one evaluation (`crucible eval --name`), in the view's order."""
    return records(con, f"SELECT * FROM {view} WHERE evaluation = ?", [evaluation])
