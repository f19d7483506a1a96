"""The `crucible` command: run an experiment, query its data with SQL, open the Dagster UI,
run a command in a sandbox, import and inspect task sets, verify solutions.

`crucible run` drives the same assets and jobs as the UI, through the same Dagster instance
(./.crucible/dagster by default), so every run it makes shows in the UI afterwards.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
from pathlib import Path

import duckdb
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from datastore import catalog, metrics
from datastore.results import FORMATS as RESULT_FORMATS
from datastore.results import write_result
from datastore.store import DatasetStore, StorageUnavailable
from pipelines import env_cli, eval_cli, tasks_cli, verify_cli
from pipelines.errors import RunFailed, UserError
from pipelines.hints import crucible_command, storage_words, this_crucible
from pipelines.instance import prepare_instance
from pipelines.settings import BACKEND_HELP, Settings, load_settings, sandbox_hosts, settings_for
from sandbox.backends import BACKENDS, open_sandbox
from sandbox.base import SandboxUnavailable
from sandbox.spec import Limits, SandboxSpec

PROJECT_DIR = Path(__file__).resolve().parent.parent
# Piped output (CI logs, `| tee`) has no terminal width: room for the run summary (100 columns) and
# most `crucible sql` results.
console = Console(width=shutil.get_terminal_size((140, 40)).columns)
errors = Console(stderr=True, soft_wrap=True)  # an error stays one line, however long


def _check_pod_template(settings: Settings) -> None:
    """The kubernetes training step's PodTemplate file, read now rather than minutes in."""
    if settings.train_client == "kubernetes":
        from assets.training_pod import PodTemplateError, load_template

        try:
            load_template(settings.train_pod_template)
        except PodTemplateError as error:
            raise UserError(f"CRUCIBLE_TRAIN_POD_TEMPLATE: {error}") from None


def command_run(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    prepare_instance(settings)
    DatasetStore(settings.storage_root).check()  # before minutes of set-up, not after
    _check_pod_template(settings)
    # torch and dagster load only when running
    from pipelines.experiment_runner import ExperimentRunner
    from training.experiment import ExperimentFileError, load_experiment_file

    experiment = None
    if args.config:
        try:
            experiment = load_experiment_file(args.config)
        except ExperimentFileError as error:
            raise UserError(str(error)) from None
    name = experiment.name if experiment else args.experiment
    try:
        runner = ExperimentRunner.for_experiment(name, deployment=settings, settings=experiment,
                                                 iterations=args.iterations, samples_per_task=args.samples_per_task)
    except ExperimentFileError as error:  # the experiment's stored settings no longer validate
        raise UserError(f"{error}\n(stored by an older Crucible? start a new experiment, or `make clean`)") from None
    runner.run()
    print_summary(runner.crucible.storage_root, name, args.storage)
    console.print(f"\n[bold]Data[/bold]:  {escape(runner.crucible.storage_root)}  "
                  f"(checkpoints: {escape(runner.crucible.checkpoint_root)})")
    for label, line in run_hints(name, args.storage):
        console.print(f"[bold]{label}[/bold]{escape(line)}", soft_wrap=True, highlight=False)
    return 0


def run_hints(experiment: str, storage: str | None) -> list[tuple[str, str]]:
    """What to do next with the experiment just run, as commands to paste (pipelines/hints.py)."""
    where = storage_words(storage)
    rewards = (f"SELECT iteration, avg(reward) FROM trajectories WHERE experiment = '{experiment}' "
               "GROUP BY 1 ORDER BY 1")
    return [("Query", ": " + crucible_command("sql", *where, rewards)),
            ("Curve", ": " + crucible_command("curve", *where, "--experiment", experiment)),
            ("UI", ":    " + crucible_command("ui", *where) + "   (then open http://127.0.0.1:3000)")]


def command_continue(args: argparse.Namespace) -> int:
    """Switch continuous training of one experiment on (or off): what the advance_iterations
    sensor, once switched on in the UI, follows."""
    from pipelines.resources import crucible_resource
    from training.experiment import ExperimentFileError

    crucible = crucible_resource(settings_for(args))
    if not crucible.experiment_exists(args.experiment):
        raise UserError(f"experiment {args.experiment!r} has no stored settings: create it with "
                        f"`{crucible_command('run', '--config', 'FILE', *storage_words(args.storage))}` first")
    try:
        stored = crucible.experiment(args.experiment)
    except ExperimentFileError as error:
        raise UserError(str(error)) from None
    updates = {"continuous": not args.off}
    if args.plateau_patience is not None:
        updates["plateau_patience"] = args.plateau_patience or None
    crucible.save_experiment(stored.model_validate({**stored.model_dump(), **updates}))
    patience = updates.get("plateau_patience", stored.plateau_patience)
    until = f"up to iteration {stored.iterations}" + (f" or {patience} iterations without a gain" if patience else "")
    state = "off" if args.off else f"on, {until}"
    console.print(f"continuous training of {args.experiment!r}: {state} (the advance_iterations sensor, when "
                  "switched on in the UI, follows it)")
    return 0


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
    """The held-out curve of an experiment as a PNG (what the README shows), and its numbers."""
    from assets.charts import eval_curve_png

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


def command_ui(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    prepare_instance(settings)
    _check_pod_template(settings)
    from datastore.trackers import how_to_open, tracker_root

    # The experiment trackers' own UIs, for what experiments reported to them (report_to).
    trackers = tracker_root(settings.storage_root, settings.checkpoint_root)
    for tracker, command in how_to_open(trackers, Path(sys.executable).parent).items():
        console.print(f"[bold]{tracker}[/bold]: {escape(command)}", soft_wrap=True)  # a command to copy whole
    # dagster dev started from a background shell would otherwise inherit ignored SIGINT/SIGTERM
    # and outlive its caller.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    dagster = shutil.which("dagster") or str(Path(sys.executable).parent / "dagster")
    os.chdir(PROJECT_DIR)
    # dagster dev runs from the project folder; the settings (their paths absolute) are this one's.
    os.execve(dagster, [dagster, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(args.port)],
              {**os.environ, **settings.environment()})
    return 0  # not reached


def command_sandbox_exec(args: argparse.Namespace) -> int:
    """Run one command in a fresh sandbox and print its ExecResult as JSON; exit 0 when the
    command succeeded (status OK), 1 otherwise."""
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise UserError("no command given: crucible sandbox exec OPTIONS -- CMD ...")
    files = {}
    for path in args.file:
        try:
            files[Path(path).name] = Path(path).read_bytes()
        except OSError as e:
            raise UserError(f"--file {path}: {e.strerror}") from None
    limits = Limits(wall_s=args.timeout, cpu_s=max(1, math.ceil(args.timeout)), memory_mb=args.memory)
    spec = SandboxSpec(limits=limits, network=args.network)
    try:
        result = open_sandbox(args.backend, spec, sandbox_hosts(load_settings())).run(command, files)
    except SandboxUnavailable as e:
        raise UserError(f"the {args.backend} sandbox is unavailable: {e}") from None
    print(json.dumps(result.to_dict(), indent=2))
    return 0 if result.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crucible", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run (or continue) an experiment's iterations")
    run.add_argument("--experiment", default="default", help="experiment name (default: default)")
    run.add_argument("--config", help="an experiment file (TOML, YAML or JSON: the settings of "
                     "training/experiment.py, `name` included); replaces --experiment")
    run.add_argument("--iterations", type=int, default=None, help="total iterations (default: the experiment's setting)")
    run.add_argument("--samples-per-task", type=int, default=None, help="GRPO group size")
    run.add_argument("--storage", help="storage root: a directory or any fsspec URI (s3://…)")
    run.set_defaults(handler=command_run)

    resume = commands.add_parser("continue", help="let the advance_iterations sensor continue one experiment")
    resume.add_argument("experiment", help="a stored experiment's name")
    resume.add_argument("--off", action="store_true", help="stop continuing it")
    resume.add_argument("--plateau-patience", type=int, default=None, metavar="N",
                        help="stop after N iterations without a better held-out pass rate (0: never)")
    resume.add_argument("--storage", help="storage root (default ./.crucible/data)")
    resume.set_defaults(handler=command_continue)

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

    ui = commands.add_parser("ui", help="open the Dagster UI on 127.0.0.1")
    ui.add_argument("--port", type=int, default=3000)
    ui.add_argument("--storage", help="storage root (default ./.crucible/data)")
    ui.set_defaults(handler=command_ui)

    sandbox = commands.add_parser("sandbox", help="run commands in a sandbox").add_subparsers(dest="action", required=True)
    execute = sandbox.add_parser("exec", help="run one command in a fresh sandbox; prints the ExecResult as JSON")
    execute.add_argument("--backend", choices=BACKENDS, help=BACKEND_HELP)
    execute.add_argument("--timeout", type=float, default=10.0, help="wall-clock seconds (default 10)")
    execute.add_argument("--memory", type=int, default=512, help="memory limit in MB (default 512)")
    execute.add_argument("--network", action="store_true", help="give the command a network")
    execute.add_argument("--file", action="append", default=[], help="copy a file into the workspace (repeatable)")
    execute.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")
    execute.set_defaults(handler=command_sandbox_exec)
    tasks_cli.add_commands(commands)
    verify_cli.add_commands(commands)
    env_cli.add_commands(commands)
    eval_cli.add_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "backend", "") is None:  # not given: the deployment's
            args.backend = load_settings().sandbox
        return args.handler(args)
    except (UserError, StorageUnavailable) as error:
        errors.print(f"[red]error:[/red] {error}", highlight=False)
        return 2
    except ValidationError as error:
        errors.print(f"[red]error:[/red] invalid setting: {error}", highlight=False)
        return 2
    except RunFailed as error:
        errors.print(f"[red]run failed:[/red] {error}", highlight=False)
        ui = crucible_command("ui", *storage_words(getattr(args, "storage", None)))
        errors.print(f"The run's full event log is in the UI: {ui}", highlight=False, markup=False)
        return 1


if __name__ == "__main__":
    sys.exit(main())
