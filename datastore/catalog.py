"""DuckDB views over every stored dataset, for analysts and for the run summary.

Views: one per dataset (trajectories, evaluations, tasks, stages, checkpoints, training_steps,
regrades, outputs, model_evaluations; a column added to a dataset after its data was stored reads
as null);
the metrics of datastore/metrics.py (task_rewards, difficulty_rewards, staleness_rewards and
iteration_rewards: the reward analytics; logprob_mismatch and logprob_mismatch_by_staleness: the
trainer's log-probs against the sampler's; held_out_tasks and held_out: the held-out evaluation; feedback_value: the same
evaluation with observations blanked beside it; episodes, turn_analytics, pass_rate_by_turns and
failing_observations: episodes turn by turn; model_eval_*: the report of `crucible eval`);
test_results (one row
per hidden test), turns (one row per episode turn), rewards (one row per reward component of
each sample), regraded (each re-graded sample beside its original reward and verdict), and
iterations (the run summary).
A dataset with no partitions yet still has its view (empty, correctly typed), so queries never
fail just because an experiment has not reached a stage. A damaged part (its manifest
unreadable, or a file it names missing or cut short: `damaged_parts`) fails only the queries that
read its partition, with a sentence that names it; the others answer from the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import duckdb

from datastore.atomic import written_atomically
from datastore.metrics import METRIC_VIEWS
from datastore.schema import DATASETS
from datastore.store import DatasetStore, Published, StorageUnavailable

DERIVED_VIEWS = {
    **METRIC_VIEWS,
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
    "regraded": """
        SELECT experiment, iteration, task_id, group_id, sample_index, original_reward_version,
               original_reward, original_passed, reward_version, reward, reward_status, passed,
               passed IS DISTINCT FROM original_passed AS verdict_changed, tamper_flags, regraded_at
        FROM regrades
    """,
    "iterations": """
        WITH timing AS (
            PIVOT (SELECT experiment, iteration, stage, seconds FROM stages)
            ON stage IN ('rollouts', 'verified_rollouts', 'trajectories', 'parent_checkpoint', 'checkpoint',
                         'checkpoint_eval')
            USING sum(seconds) GROUP BY experiment, iteration
        )
        SELECT experiment, iteration, r.tasks, r.samples, r.pass_rate, r.reward_mean, r.sampled_tokens,
               r.infra_error_rate, h.pass_rate AS eval_pass_rate, h.stderr AS eval_stderr,
               h.improvement AS eval_improvement, h.improvement_stderr AS eval_improvement_stderr,
               f.blanked_pass_rate AS eval_blanked_pass_rate, f.blanked_stderr AS eval_blanked_stderr,
               f.feedback_gap, f.feedback_gap_stderr,
               e.turns_per_episode, c.mean_step_kl, c.final_kl, c.entropy, c.grad_norm,
               c.tokens_per_s AS train_tokens_per_s, timing.* EXCLUDE (experiment, iteration)
        FROM iteration_rewards r
        FULL JOIN held_out h USING (experiment, iteration)  -- iteration 0: the base policy's evaluation
        LEFT JOIN feedback_value f USING (experiment, iteration)
        LEFT JOIN turn_analytics e USING (experiment, iteration)
        LEFT JOIN checkpoints c USING (experiment, iteration)
        LEFT JOIN timing USING (experiment, iteration)
        ORDER BY experiment, iteration
    """,
}

VIEWS = (*DATASETS, *DERIVED_VIEWS)


def connect(root_uri: str, database: str = ":memory:", snapshot: bool = False,
            pinned: Mapping[str, list[str]] | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with one view per dataset under `root_uri`, over the files its
    manifests name (datastore/store.py); `snapshot` copies the data into tables instead.
    `pinned` datasets read exactly the files given (one version, such as the trajectory files a
    training step read) instead of what their manifests name now."""
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
        damaged: list[Published] = []
        if pinned and name in pinned:
            files, mixed = pinned[name], False
        else:
            parts = store.published(name)
            damaged = [part for part in parts if part.damage]
            parts = [part for part in parts if not part.damage]
            files = [uri for part in parts for uri in part.files]
            # Matching columns by name costs a footer read per file at every bind (slow on S3):
            # only when the manifests say that schema versions differ.
            mixed = len({part.schema_version for part in parts}) > 1
        empty = f"(SELECT *, NULL::VARCHAR AS experiment, NULL::BIGINT AS iteration FROM _empty_{name})"
        con.register(f"_empty_{name}", schema.empty_table())
        if files:
            listed = ", ".join(_sql_string(uri) for uri in files)
            source = f"read_parquet([{listed}], hive_partitioning = true, union_by_name = {str(mixed).lower()})"
        else:
            source = empty
        query = f"SELECT * FROM {source}"
        try:
            if files and _missing_columns(con, query, schema):
                # Data stored before a column existed (every part older than it): the column reads as null.
                query += f" UNION ALL BY NAME SELECT * FROM {empty}"
            for part in damaged:
                query += f" UNION ALL BY NAME {_failing(name, part)}"
            con.execute(f"CREATE OR REPLACE {kind} {name} AS {query}")
        except duckdb.Error as error:  # a file that looked whole and is not (or a snapshot of a damaged part)
            raise StorageUnavailable(f"storage {store.uri}: {name}: {error}") from None
        if snapshot:
            con.unregister(f"_empty_{name}")
    for name, query in DERIVED_VIEWS.items():
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {query}")
    return con


def damaged_parts(root_uri: str) -> dict[str, list[Published]]:
    """Every dataset's damaged parts (an unreadable manifest, a file it names missing or cut short)."""
    store = DatasetStore(root_uri)
    store.check()
    return {name: damaged for name in DATASETS if (damaged := [p for p in store.published(name) if p.damage])}


def _failing(dataset: str, part: Published) -> str:
    """Rows of `part`'s partition that fail any query reading them, with what is wrong; a query
    of other partitions never evaluates them (its filter on experiment and iteration leaves them out)."""
    experiment, iteration, name = part.partition
    message = (f"{dataset}, experiment {experiment} iteration {iteration} ({name}), is damaged: {part.damage}. "
               "`crucible data check` lists every damaged part and what to do")
    return (f"SELECT e.*, {_sql_string(experiment)} AS experiment, {iteration}::BIGINT AS iteration FROM (SELECT 1) "
            f"AS one LEFT JOIN _empty_{dataset} AS e ON false WHERE error({_sql_string(message)}) IS NULL")


def _missing_columns(con: duckdb.DuckDBPyConnection, query: str, schema) -> list[str]:
    """The dataset's columns that `query` (over its files) lacks."""
    present = {column[0] for column in con.execute(f"{query} LIMIT 0").description}
    return [field.name for field in schema if field.name not in present]


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
