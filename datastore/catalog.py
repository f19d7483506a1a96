"""DuckDB views over every stored dataset, for analysts and for the run summary.

Views: one per dataset (trajectories, evaluations, tasks, stages, checkpoints, training_steps) and
derived ones: test_results (one row per hidden test), turns (one row per episode turn), rewards
(one row per reward component of each sample), task_rewards and iteration_rewards (the reward
analytics, per task and per iteration), iterations (the run summary).
A dataset with no partitions yet still has its view (empty, correctly typed), so queries never
fail just because an experiment has not reached a stage.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from datastore.atomic import written_atomically
from datastore.schema import DATASETS
from datastore.store import DatasetStore, StorageUnavailable

# The reward analytics' measures, over samples annotated with `flat_group` (all the rewards of the
# sample's group are equal: the group carries no learning signal). A sample's sandbox time is its
# grading (set-up, tests, parsing) plus the commands its episode ran.
SAMPLE_MEASURES = """
    count(*) AS samples,
    avg(passed::INT) AS pass_rate,
    avg(reward) AS reward_mean,
    coalesce(stddev_samp(reward), 0) AS reward_std,
    count(DISTINCT group_id) AS groups,
    count(DISTINCT group_id) FILTER (WHERE flat_group) AS zero_variance_groups,
    avg((reward_status = 'infra_error')::INT) AS infra_error_rate,
    avg((reward_status = 'invalid')::INT) AS invalid_rate,
    avg((finish_reason = 'length')::INT) AS truncation_rate,
    avg((len(tamper_flags) > 0)::INT) AS tamper_rate,
    avg(timings.generate_s) AS generate_s,
    avg(timings.verify_s + coalesce(list_sum([t.exec_s FOR t IN turns]), 0)) AS sandbox_s,
    avg(response_tokens) AS response_tokens
"""
SAMPLES_WITH_GROUP_FLAG = """
    (SELECT *, max(reward) OVER g IS NOT DISTINCT FROM min(reward) OVER g AS flat_group
     FROM trajectories WINDOW g AS (PARTITION BY experiment, iteration, group_id))
"""

DERIVED_VIEWS = {
    "task_rewards": f"""
        SELECT experiment, iteration, task_id, any_value(family) AS family,
               any_value(difficulty) AS difficulty, {SAMPLE_MEASURES}
        FROM {SAMPLES_WITH_GROUP_FLAG} GROUP BY experiment, iteration, task_id
    """,
    "iteration_rewards": f"""
        SELECT experiment, iteration, count(DISTINCT task_id) AS tasks, {SAMPLE_MEASURES},
               zero_variance_groups / groups AS zero_variance_fraction,
               quantile_cont(reward, 0.1) AS reward_p10, median(reward) AS reward_p50,
               quantile_cont(reward, 0.9) AS reward_p90,
               sum(prompt_tokens)::BIGINT AS prompt_tokens, sum(response_tokens)::BIGINT AS generated_tokens
        FROM {SAMPLES_WITH_GROUP_FLAG} GROUP BY experiment, iteration
    """,
    "test_results": """
        SELECT experiment, iteration, task_id, group_id, sample_index,
               t.name AS test_name, t.outcome, t.message
        FROM (SELECT *, unnest(test_results) AS t FROM trajectories)
    """,
    "turns": """
        SELECT experiment, iteration, task_id, group_id, sample_index, unnest(turn)
        FROM (SELECT *, unnest(turns) AS turn FROM trajectories)
    """,
    "rewards": """
        SELECT experiment, iteration, task_id, family, difficulty, group_id, sample_index,
               reward, reward_status, reward_version, c.key AS component, c.value
        FROM (SELECT *, unnest(map_entries(reward_components)) AS c FROM trajectories)
    """,
    "iterations": """
        WITH rollout AS (
            SELECT experiment, iteration,
                   count(DISTINCT task_id) AS tasks,
                   count(*) AS samples,
                   avg(passed::INT) AS pass_rate,
                   avg(reward) AS mean_reward,
                   sum(response_tokens) AS generated_tokens,
                   avg((reward_status = 'infra_error')::INT) AS infra_error_rate
            FROM trajectories GROUP BY ALL
        ),
        held_out AS (  -- tasks are the unit (training/evaluation.py)
            SELECT experiment, iteration,
                   avg(task_rate) AS eval_pass_rate,
                   coalesce(stddev_samp(task_rate) / sqrt(count(*)), 0) AS eval_stderr
            FROM (SELECT experiment, iteration, task_id, avg(passed::INT) AS task_rate
                  FROM evaluations GROUP BY ALL)
            GROUP BY ALL
        ),
        timing AS (
            PIVOT (SELECT experiment, iteration, stage, seconds FROM stages)
            ON stage IN ('rollouts', 'verified_rollouts', 'trajectories', 'checkpoint',
                         'checkpoint_eval')
            USING sum(seconds) GROUP BY experiment, iteration
        )
        SELECT * FROM rollout
        FULL JOIN held_out USING (experiment, iteration)  -- iteration 0: the base policy's evaluation
        LEFT JOIN timing USING (experiment, iteration)
        ORDER BY experiment, iteration
    """,
}

VIEWS = (*DATASETS, *DERIVED_VIEWS)


def connect(root_uri: str, database: str = ":memory:", snapshot: bool = False) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with one view per dataset under `root_uri`, over the files its
    manifests name (datastore/store.py); `snapshot` copies the data into tables instead."""
    store = DatasetStore(root_uri)
    store.check()
    con = duckdb.connect(database)
    # A data file is never rewritten (datastore/store.py), so its footer can be cached safely.
    con.execute("SET parquet_metadata_cache = true")
    if not store.is_local:
        # httpfs cannot be downloaded offline; DuckDB reads remote files through fsspec instead.
        con.register_filesystem(store.fs)
    kind = "TABLE" if snapshot else "VIEW"
    for name, schema in DATASETS.items():
        parts = store.published(name)
        files = [uri for part in parts for uri in part.files]
        if files:
            listed = ", ".join(_sql_string(uri) for uri in files)
            # Matching columns by name costs a footer read per file at every bind (slow on S3):
            # only when the manifests say that schema versions differ.
            mixed = len({part.schema_version for part in parts}) > 1
            source = f"read_parquet([{listed}], hive_partitioning = true, union_by_name = {str(mixed).lower()})"
        else:
            con.register(f"_empty_{name}", schema.empty_table())
            source = f"(SELECT *, NULL::VARCHAR AS experiment, NULL::BIGINT AS iteration FROM _empty_{name})"
        try:
            con.execute(f"CREATE OR REPLACE {kind} {name} AS SELECT * FROM {source}")
        except duckdb.Error as error:  # a file its manifest names is missing or unreadable
            raise StorageUnavailable(f"storage {store.uri}: {name}: {error}") from None
        if snapshot and not files:
            con.unregister(f"_empty_{name}")
    for name, query in DERIVED_VIEWS.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {query}")
    return con


def export_database(root_uri: str, path: Path) -> None:
    """A DuckDB file for notebooks and BI tools: every dataset under `root_uri` copied into a
    table (a self-contained snapshot, local or S3 alike) and the derived views over them. A
    failed export leaves no half-made file."""
    with written_atomically(path) as partial:
        try:
            connect(root_uri, str(partial), snapshot=True).close()
        finally:
            Path(f"{partial}.wal").unlink(missing_ok=True)  # DuckDB's write-ahead log, if it failed midway


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
