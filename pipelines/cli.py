"""The `crucible` command: run an experiment, query its data with SQL, open the Dagster UI,
run a command in a sandbox, import and inspect task sets, verify solutions.

`crucible run` drives the same assets and jobs as the UI, through the same Dagster instance
(./.crucible/dagster by default), so every run it makes shows in the UI afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
from pathlib import Path

from pydantic import ValidationError
from rich.markup import escape

from commands import data, env, reports, sandbox, tasks, verify
from commands.console import console, errors
from commands.errors import UserError
from commands.hints import crucible_command, storage_words
from commands.settings import Settings, load_settings, settings_for
from datastore.store import DatasetStore, StorageUnavailable
from pipelines import eval_cli
from pipelines.errors import RunFailed
from pipelines.instance import prepare_instance

PROJECT_DIR = Path(__file__).resolve().parent.parent


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
    if args.rerun_from is not None and args.rerun_from < 1:
        raise UserError(f"--from {args.rerun_from}: give an iteration, 1 or more")
    runner.run(rerun_from=args.rerun_from)
    reports.print_summary(runner.crucible.storage_root, name, args.storage)
    console.print(f"\n[bold]Data[/bold]:  {escape(runner.crucible.storage_root)}  "
                  f"(checkpoints: {escape(runner.crucible.checkpoint_root)})")
    for label, line in run_hints(name, args.storage):
        console.print(f"[bold]{label}[/bold]{escape(line)}", soft_wrap=True, highlight=False)
    return 0


def run_hints(experiment: str, storage: str | None) -> list[tuple[str, str]]:
    """What to do next with the experiment just run, as commands to paste (commands/hints.py)."""
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="crucible", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run (or continue) an experiment's iterations")
    run.add_argument("--experiment", default="default", help="experiment name (default: default)")
    run.add_argument("--config", help="an experiment file (TOML, YAML or JSON: the settings of "
                     "training/experiment.py, `name` included); replaces --experiment")
    run.add_argument("--iterations", type=int, default=None, help="total iterations (default: the experiment's setting)")
    run.add_argument("--samples-per-task", type=int, default=None, help="GRPO group size")
    run.add_argument("--from", dest="rerun_from", type=int, metavar="N", help="run iterations N and later again, "
                     "even those already evaluated (an iteration whose checkpoint fails verification is run again "
                     "without it)")
    run.add_argument("--storage", help="storage root: a directory or any fsspec URI (s3://…)")
    run.set_defaults(handler=command_run)

    resume = commands.add_parser("continue", help="let the advance_iterations sensor continue one experiment")
    resume.add_argument("experiment", help="a stored experiment's name")
    resume.add_argument("--off", action="store_true", help="stop continuing it")
    resume.add_argument("--plateau-patience", type=int, default=None, metavar="N",
                        help="stop after N iterations without a better held-out pass rate (0: never)")
    resume.add_argument("--storage", help="storage root (default ./.crucible/data)")
    resume.set_defaults(handler=command_continue)

    ui = commands.add_parser("ui", help="open the Dagster UI on 127.0.0.1")
    ui.add_argument("--port", type=int, default=3000)
    ui.add_argument("--storage", help="storage root (default ./.crucible/data)")
    ui.set_defaults(handler=command_ui)

    for module in (reports, data, sandbox, tasks, verify, env, eval_cli):
        module.add_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "backend", "") is None:  # not given: the deployment's
            args.backend = load_settings().sandbox
        return args.handler(args)
    except (UserError, StorageUnavailable) as error:  # user text is never markup: '[a-z]' stays as typed
        errors.print(f"[red]error:[/red] {escape(str(error))}", highlight=False)
        return 2
    except ValidationError as error:
        for problem in error.errors():
            field = ".".join(str(part) for part in problem["loc"])
            errors.print(f"[red]error:[/red] invalid setting {escape(field)}: {escape(problem['msg'])}", highlight=False)
        return 2
    except RunFailed as error:
        errors.print(f"[red]run failed:[/red] {escape(str(error))}", highlight=False)
        ui = crucible_command("ui", *storage_words(getattr(args, "storage", None)))
        errors.print(f"The run's full event log is in the UI: {ui}", highlight=False, markup=False)
        return 1


if __name__ == "__main__":
    sys.exit(main())
