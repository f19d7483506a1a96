"""`crucible data check`: every damaged part of the stored datasets, and what to do about each.

A part is damaged when its manifest cannot be read, or a data file it names is missing or has
fewer bytes than were written (a truncated copy). Queries that read a damaged partition fail
with a sentence naming it; the others answer (datastore/catalog.py).
"""

from __future__ import annotations

import argparse

from commands.console import console, errors
from commands.settings import settings_for
from datastore import catalog
from datastore.schema import WRITTEN_BY
from datastore.store import Published



def add_commands(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="check the stored datasets")
    checks = data.add_subparsers(dest="data_command", required=True)
    check = checks.add_parser("check", help="list every damaged part of the stored datasets, and what to do")
    check.add_argument("--storage", help="storage root (default ./.crucible/data)")
    check.set_defaults(handler=command_check)


def command_check(args: argparse.Namespace) -> int:
    storage_root = settings_for(args).storage_root
    damaged = catalog.damaged_parts(storage_root)
    if not damaged:
        console.print(f"no damaged part in {storage_root}", markup=False, highlight=False)
        return 0
    for dataset, parts in damaged.items():  # a line each, never wrapped: its paths and commands are copied whole
        for part in parts:
            experiment, iteration, name = part.partition
            console.print(f"{dataset} {experiment}|{iteration:04d} ({name}): {part.damage}\n  what to do: "
                          f"{remedy(dataset, part)}", markup=False, highlight=False, soft_wrap=True)
    count = sum(map(len, damaged.values()))
    errors.print(f"{count} damaged part{'s' if count > 1 else ''} in {storage_root}", markup=False, highlight=False)
    return 1


def remedy(dataset: str, part: Published) -> str:
    """What writes the part again; the damaged version is then superseded and swept."""
    experiment, iteration, name = part.partition
    if dataset == "model_evaluations":
        return f"run `crucible eval --name {experiment}` again, with its task set and model"
    if dataset == "evaluations" and iteration == 0:  # the base policy's, which checkpoint_eval makes when it is absent
        return f"delete {part.manifest}; the next checkpoint_eval of {experiment} evaluates the base policy again"
    asset = WRITTEN_BY.get(dataset, name)
    return (f"materialize {asset} for partition {experiment}|{iteration:04d} again (the UI's asset page, or "
            f"`dagster asset materialize --select {asset} --partition '{experiment}|{iteration:04d}'`)")
