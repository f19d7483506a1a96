"""What the stored data says, read with DuckDB (datastore/catalog.py, datastore/metrics.py):
`crucible sql`, `crucible curve`, and the summary table `crucible run` ends with."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import duckdb
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from commands.console import console, errors
from commands.errors import UserError
from commands.hints import crucible_command, storage_words, this_crucible
from commands.settings import settings_for
from datastore import catalog, metrics
from datastore.results import FORMATS as RESULT_FORMATS
from datastore.results import write_result

# The iterations view's timing columns (one per stage, in the order they run), by what they do.
STAGES = {"rollouts": "sampling", "verified_rollouts": "grading", "trajectories": "storing",
          "checkpoint": "training", "checkpoint_eval": "eval"}
SUMMARY_COLUMNS = ("iter", "train pass", "reward", "tokens/sample", "held-out ± se", "blanked", "seconds",
                   "slowest stage")


def _cell(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def print_summary(storage_root: str, experiment: str, storage: str | None) -> None:
    """One row per iteration, read back from the stored datasets: what shows at a glance whether
    training helps; the command that shows every column under it (`storage`: the --storage given)."""
    rows = metrics.curve(catalog.connect(storage_root), "iterations", experiment)
    console.print(summary_table(experiment, rows))
    every_column = f"SELECT * FROM iterations WHERE experiment = '{experiment}'"
    console.print(f"every column: {escape(crucible_command('sql', *storage_words(storage), every_column))}",
                  soft_wrap=True, highlight=False)


def summary_table(experiment: str, rows: list[dict]) -> Table:
    """The summary's rows (the iterations view's) in 100 columns: train and held-out pass rates, the
    policy's tokens per sample, and where the time went."""
    table = Table(title=f"experiment {experiment!r}", caption="iteration 0: the base policy; tokens/sample: the "
                  "policy's own; seconds: its stages' sum")
    for header in SUMMARY_COLUMNS:
        table.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        held_out = "" if row["eval_pass_rate"] is None else f"{row['eval_pass_rate']:.3f} ± {row['eval_stderr']:.3f}"
        seconds = {label: row[stage] for stage, label in STAGES.items() if row[stage] is not None}
        slowest = max(seconds, key=seconds.get) if seconds else None
        table.add_row(str(row["iteration"]), _cell(row["pass_rate"], ".3f"), _cell(row["reward_mean"], ".3f"),
                      _cell(row["sampled_tokens"], ".0f"), held_out, _cell(row["eval_blanked_pass_rate"], ".3f"),
                      _cell(sum(seconds.values()) if seconds else None, ".0f"),
                      "" if slowest is None else f"{slowest} {seconds[slowest]:.0f}s")
    return table


def command_sql(args: argparse.Namespace) -> int:
    storage_root = settings_for(args).storage_root
    if args.export_db:
        return _export_database(args, storage_root)
    if not args.query:
        raise UserError("give a query, or --export-db FILE.duckdb")
    if args.out and args.format == "table":
        raise UserError("--out needs --format csv, json or parquet")
    if args.format == "parquet" and not args.out:
        raise UserError("parquet is binary: give --out FILE")
    con = catalog.connect(storage_root)
    try:
        if args.format != "table":
            relation = con.sql(args.query)  # None for a statement that returns no rows
            if relation is not None:
                write_result(relation.to_arrow_table(), args.format, args.out, sys.stdout.buffer)
                if args.out:
                    errors.print(f"wrote {args.out}", highlight=False)
            return 0
        result = con.execute(args.query)
    except duckdb.Error as error:
        raise UserError(f"{error}\navailable views: {', '.join(catalog.VIEWS)}") from None
    except ValueError as error:  # a result the format cannot hold (datastore/results.py)
        raise UserError(str(error)) from None
    except OSError as error:
        raise UserError(f"{args.out}: cannot write: {error.strerror}") from None
    if result.description is None:
        return 0
    table = Table()
    for column in result.description:
        table.add_column(column[0])
    for row in result.fetchall():
        # Text: a value is never read as rich markup (a list like "[1, 2]" would vanish).
        table.add_row(*(Text("NULL" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)) for v in row))
    console.print(table)
    return 0


def _export_database(args: argparse.Namespace, storage_root: str) -> int:
    if args.query or args.out or args.format != "table":
        raise UserError("--export-db writes the views themselves: it takes no query, --out or --format")
    try:
        catalog.export_database(storage_root, args.export_db)
    except (OSError, duckdb.Error) as error:
        raise UserError(f"{args.export_db}: cannot write: {error}") from None
    errors.print(f"wrote {args.export_db}: a snapshot of {', '.join(catalog.VIEWS)}", highlight=False)
    return 0


def stored_experiment(con: duckdb.DuckDBPyConnection, name: str | None, storage_root: str) -> str:
    """`name`, or the most recent experiment when None; refused when the store (`storage_root`,
    which `con` reads) has no such one."""
    stored = metrics.stored_experiments(con)
    if not stored:
        raise UserError(f"no experiment has run under {storage_root}: run one first "
                        f"({this_crucible()} run --help)")
    if name is None:
        return stored[0]
    if name not in stored:
        raise UserError(f"no experiment {name!r} under {storage_root}; stored, the most recent "
                        f"first: {', '.join(stored)}")
    return name


def command_curve(args: argparse.Namespace) -> int:
    """The held-out curve of an experiment as a PNG (as docs/benchmarks.md shows it), and its numbers."""
    from datastore.charts import eval_curve_png  # matplotlib: loaded by the command that draws

    storage_root = settings_for(args).storage_root
    con = catalog.connect(storage_root)
    experiment = stored_experiment(con, args.experiment, storage_root)
    rows = metrics.held_out_with_feedback(con, experiment)
    if not rows or rows[0]["iteration"] != 0:
        raise UserError(f"experiment {experiment!r} has no scored evaluation of its base policy (iteration 0) "
                        f"under {storage_root}: run it first")
    table = Table(title=f"{experiment}: held-out pass rate (iteration 0 = base policy)")
    for header in ("iteration", "pass rate", "stderr", "vs base", "paired stderr", "in stderrs",
                   "blanked", "feedback gap ± paired se", "in stderrs"):
        table.add_column(header, justify="right")
    for row in rows:
        gap = row["feedback_gap"]
        table.add_row(str(row["iteration"]), f"{row['pass_rate']:.3f}", f"{row['stderr']:.3f}",
                      _cell(row["improvement"], "+.3f"),
                      _cell(row["improvement_stderr"] if row["paired_tasks"] else None, ".3f"),
                      "" if row["iteration"] == 0 else _cell(row["improvement_in_stderrs"], "+.1f"),
                      _cell(row["blanked_pass_rate"], ".3f"),
                      "" if gap is None else f"{gap:+.3f} ± {row['feedback_gap_stderr']:.3f}",
                      _cell(row["feedback_gap_in_stderrs"], "+.1f"))
    blanked = [(r["iteration"], r["blanked_pass_rate"], r["blanked_stderr"]) for r in rows
               if r["blanked_pass_rate"] is not None]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_bytes(eval_curve_png(experiment, [(r["iteration"], r["pass_rate"], r["stderr"])
                                                           for r in rows], blanked))
    console.print(table)
    console.print(f"curve written to {args.out}")
    return 0


def add_commands(commands: argparse._SubParsersAction) -> None:
    sql = commands.add_parser("sql", help="query trajectories and summaries with DuckDB")
    sql.add_argument("query", nargs="?", help="a DuckDB query over the views (see --export-db for none)")
    sql.add_argument("--format", choices=("table", *RESULT_FORMATS), default="table",
                     help="table (default, for reading), csv, json (one object per line) or parquet")
    sql.add_argument("--out", type=Path, help="write the result to this file (whole or not at all)")
    sql.add_argument("--export-db", type=Path, metavar="FILE.duckdb",
                     help="write a DuckDB database with every dataset (a snapshot) and view, for notebooks and BI tools")
    sql.add_argument("--storage", help="storage root (default ./.crucible/data)")
    sql.set_defaults(handler=command_sql)

    curve = commands.add_parser("curve", help="plot an experiment's held-out pass rate per iteration (PNG)")
    curve.add_argument("--experiment", help="experiment name (default: the most recent, the one whose latest stage "
                       "started last)")
    curve.add_argument("--out", default="learning-curve.png", help="PNG file to write (default learning-curve.png)")
    curve.add_argument("--storage", help="storage root (default ./.crucible/data)")
    curve.set_defaults(handler=command_curve)
