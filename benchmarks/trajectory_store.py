"""The trajectory store at scale: 1M realistic trajectory rows written through DatasetStore, then
three analyst queries over all iterations, on the local disk and on S3 (a SeaweedFS server
started for the run), with DuckDB (Crucible's catalog) and polars side by side.

    .venv/bin/pip install -r benchmarks/requirements-polars.txt   # once: the peer
    .venv/bin/python benchmarks/trajectory_store.py [--rows 1000000] [--iterations 50] [--repeats 3]

Rows carry every column of the trajectories schema with realistic sizes: ~100 prompt and ~60
response token ids, their loss mask and log-probs, one turn, three test results, reward terms,
timings; 8 samples per task. Each iteration is one partition (one Parquet file and its manifest).
Both engines read the same files, listed from the manifests (as every Crucible reader does);
listing them is timed apart ("open"). A query's time is the median of `--repeats` runs.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
from rich.console import Console
from rich.table import Table

from datastore import catalog
from datastore.schema import TEST_RESULT, TIMINGS, TRAJECTORIES, TURN
from datastore.seaweedfs import seaweedfs
from datastore.store import DatasetStore

FAMILIES = [f"family_{i:02d}" for i in range(20)]
DIFFICULTIES = ["easy", "medium", "hard"]
SAMPLES_PER_TASK = 8

QUERIES = {
    "pass rate per iteration": (
        "SELECT iteration, avg(passed::INT) AS pass_rate, avg(reward) AS reward FROM trajectories "
        "GROUP BY iteration ORDER BY iteration",
        lambda t, pl: t.group_by("iteration").agg(pl.col("passed").cast(pl.Int32).mean().alias("pass_rate"),
                                                  pl.col("reward").mean()).sort("iteration"),
    ),
    "10 hardest tasks over all iterations": (
        "SELECT task_id, avg(passed::INT) AS pass_rate, count(*) AS samples FROM trajectories "
        "GROUP BY task_id ORDER BY pass_rate, task_id LIMIT 10",
        lambda t, pl: t.group_by("task_id").agg(pl.col("passed").cast(pl.Int32).mean().alias("pass_rate"),
                                                pl.len().alias("samples")).sort("pass_rate", "task_id").head(10),
    ),
    "response tokens per family and iteration": (
        "SELECT family, iteration, avg(len(response_token_ids)) AS tokens, max(timings.exec_s) AS worst_exec_s "
        "FROM trajectories GROUP BY ALL ORDER BY ALL",
        lambda t, pl: t.group_by("family", "iteration").agg(
            pl.col("response_token_ids").list.len().mean().alias("tokens"),
            pl.col("timings").struct.field("exec_s").max().alias("worst_exec_s")).sort("family", "iteration"),
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    try:
        import polars as pl
    except ImportError:
        sys.exit("polars is not installed: .venv/bin/pip install -r benchmarks/requirements-polars.txt")
    console = Console(width=200)
    rows_per_iteration = args.rows // args.iterations
    console.print(f"generating {rows_per_iteration * args.iterations:,} rows in {args.iterations} iterations")
    partitions = [trajectory_table(rows_per_iteration, seed=i) for i in range(args.iterations)]
    megabytes = sum(t.nbytes for t in partitions) / 1e6
    results: dict[str, dict[tuple[str, str], float]] = {"write": {}, "open (list manifests)": {}}
    with tempfile.TemporaryDirectory() as scratch, seaweedfs(Path(scratch) / "s3") as server:
        os.environ.update(server.environment())
        roots = {"local": str(Path(scratch) / "data"), "S3": f"s3://{server.bucket}/bench"}
        polars_options = {"local": None, "S3": {
            "aws_endpoint_url": server.endpoint, "aws_access_key_id": server.access_key,
            "aws_secret_access_key": server.secret_key, "aws_region": "us-east-1", "aws_allow_http": "true"}}
        for place, root in roots.items():
            console.print(f"[bold]{place}[/bold]: writing {len(partitions)} partitions")
            results["write"][place, "crucible"] = write_all(DatasetStore(root), partitions)
            files, listed = timed(lambda root=root: DatasetStore(root).dataset_files("trajectories"))
            connection, connected = timed(lambda root=root: catalog.connect(root))
            results["open (list manifests)"] |= {(place, "DuckDB"): connected, (place, "polars"): listed}
            for name, (sql, polars_query) in QUERIES.items():
                console.print(f"[bold]{place}[/bold]: {name}")
                scan = pl.scan_parquet(files, hive_partitioning=True, storage_options=polars_options[place])
                check_same_answer(connection.execute(sql).fetchall(), polars_query(scan, pl).collect().rows(), name)
                results.setdefault(name, {})[place, "DuckDB"] = median_seconds(
                    lambda sql=sql, c=connection: c.execute(sql).fetchall(), args.repeats)
                results[name][place, "polars"] = median_seconds(
                    lambda q=polars_query, s=scan: q(s, pl).collect(), args.repeats)
    print_table(console, results, rows_per_iteration * args.iterations, megabytes)


def trajectory_table(rows: int, seed: int) -> pa.Table:
    """One iteration's rows, built column by column (a Python dict per row would take minutes)."""
    rng = np.random.default_rng(seed)
    tasks = rows // SAMPLES_PER_TASK
    task_index = np.repeat(np.arange(tasks), SAMPLES_PER_TASK)
    sample_index = np.tile(np.arange(SAMPLES_PER_TASK, dtype=np.int32), tasks)
    # Harder tasks pass less; the policy improves with the iteration (seed).
    skill = rng.beta(2, 2, tasks)[task_index] * (0.5 + seed / 100)
    passed = rng.random(rows) < skill
    reward = np.where(passed, 1.0, rng.choice([0.0, 0.25, 0.5], rows))
    prompt_lengths = rng.integers(80, 120, rows)
    response_lengths = rng.integers(20, 100, rows)
    task_ids = np.array([f"compose/{FAMILIES[i % 20]}/{i:05d}" for i in range(tasks)], dtype=object)[task_index]
    text = pa.array(["def solve(x):\n    return sorted(x)[:3]\n"] * rows)
    columns = {
        "task_id": pa.array(task_ids),
        "task_version": pa.array([f"{i:016x}" for i in task_index]),
        "split": pa.array(["train"] * rows),
        "difficulty": pa.array(np.array(DIFFICULTIES, dtype=object)[task_index % 3]),
        "family": pa.array(np.array(FAMILIES, dtype=object)[task_index % 20]),
        "group_id": pa.array([f"it{seed}/{i}" for i in task_index]),
        "sample_index": pa.array(sample_index),
        "policy_version": pa.array([f"policy{seed:04d}"] * rows),
        "prompt_token_ids": token_lists(rng, prompt_lengths, np.int32),
        "response_token_ids": token_lists(rng, response_lengths, np.int32),
        "loss_mask": pa.ListArray.from_arrays(offsets(response_lengths), np.ones(response_lengths.sum(), np.int8)),
        "behaviour_logprobs": pa.ListArray.from_arrays(
            offsets(response_lengths), -rng.exponential(0.3, response_lengths.sum()).astype(np.float32)),
        "response_text": text,
        "turns": pa.array([[{"index": 0, "reply": "def solve(x): ...", "action": "submit", "detail": "",
                             "status": "submitted", "exit_code": None, "observation_excerpt": "",
                             "generate_s": 0.2, "exec_s": 0.0, "sampled_tokens": 60}]] * rows, pa.list_(TURN)),
        "patch": text,
        "test_results": pa.array([[{"name": f"test_{k}", "outcome": "passed", "message": ""} for k in range(3)]]
                                 * rows, pa.list_(TEST_RESULT)),
        "reward_components": pa.array([[("tests_passed_fraction", r)] for r in reward.tolist()],
                                      pa.map_(pa.string(), pa.float64())),
        "reward": pa.array(reward),
        "reward_status": pa.array(["scored"] * rows),
        "reward_version": pa.array(["tests-passed-fraction@5e1e1b606039"] * rows),
        "passed": pa.array(passed),
        "tamper_flags": pa.array([[]] * rows, pa.list_(pa.string())),
        "exec_status": pa.array(["OK"] * rows),
        "timings": pa.StructArray.from_arrays(
            [pa.array(rng.exponential(s, rows)) for s in (0.2, 0.01, 0.1, 0.15)], fields=list(TIMINGS)),
        "prompt_tokens": pa.array(prompt_lengths.astype(np.int32)),
        "sampled_tokens": pa.array(response_lengths.astype(np.int32)),  # single replies: all sampled
        "observation_tokens": pa.array(np.zeros(rows, np.int32)),
        "finish_reason": pa.array(np.where(response_lengths > 95, "length", "stop").astype(object)),
        "error_class": pa.nulls(rows, pa.string()),
        "sandbox_backend": pa.array(["local"] * rows),
        "sandbox_spec_hash": pa.array(["0f3a9c"] * rows),
    }
    return pa.Table.from_pydict(columns, schema=TRAJECTORIES)


def offsets(lengths: np.ndarray) -> pa.Array:
    return pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))


def token_lists(rng: np.random.Generator, lengths: np.ndarray, dtype) -> pa.Array:
    return pa.ListArray.from_arrays(offsets(lengths), rng.integers(3, 1024, lengths.sum()).astype(dtype))


def write_all(store: DatasetStore, partitions: list[pa.Table]) -> float:
    started = time.perf_counter()
    for iteration, table in enumerate(partitions, start=1):
        store.write_partition("trajectories", "bench", iteration, table)
    return time.perf_counter() - started


def timed(work: Callable):
    started = time.perf_counter()
    result = work()
    return result, time.perf_counter() - started


def median_seconds(work: Callable, repeats: int) -> float:
    return statistics.median(timed(work)[1] for _ in range(repeats))


def check_same_answer(duck: list[tuple], polar: list[tuple], name: str) -> None:
    """Both engines must answer the same; a benchmark of a wrong answer means nothing."""
    for a, b in zip(duck, polar, strict=True):
        if any(x != y and not (isinstance(x, float) and abs(x - y) < 1e-9) for x, y in zip(a, b, strict=True)):
            raise AssertionError(f"{name}: DuckDB {a} but polars {b}")


def print_table(console: Console, results: dict[str, dict[tuple[str, str], float]], rows: int,
                megabytes: float) -> None:
    table = Table(title=f"trajectory store: {rows:,} rows ({megabytes:,.0f} MB in Arrow), seconds")
    columns = [("local", "DuckDB"), ("local", "polars"), ("S3", "DuckDB"), ("S3", "polars")]
    table.add_column("measure")
    for place, engine in columns:
        table.add_column(f"{place} {engine}", justify="right")
    for header in ("polars / DuckDB local", "polars / DuckDB S3", "S3 / local DuckDB"):
        table.add_column(header, justify="right")
    for measure, times in results.items():
        if measure == "write":
            table.add_row(measure, f"{times['local', 'crucible']:.2f}", "", f"{times['S3', 'crucible']:.2f}", "", "", "",
                          f"{times['S3', 'crucible'] / times['local', 'crucible']:.2f}x")
            continue
        table.add_row(measure, *(f"{times[c]:.3f}" for c in columns),
                      *(f"{times[place, 'polars'] / times[place, 'DuckDB']:.2f}x" for place in ("local", "S3")),
                      f"{times['S3', 'DuckDB'] / times['local', 'DuckDB']:.2f}x")
    console.print(table)
    for place in ("local", "S3"):
        seconds = results["write"][place, "crucible"]
        console.print(f"write to {place} (DatasetStore: zstd Parquet, then the manifest): {rows / seconds:,.0f} rows/s, "
                      f"{megabytes / seconds:,.0f} MB/s of Arrow data")


if __name__ == "__main__":
    main()
