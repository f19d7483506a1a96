"""The experiment's trackers (`report_to`, datastore/trackers/), told at the end of each iteration
what the views now say, its evaluation included. A tracker that cannot be written costs a warning,
never the iteration: what it missed is written by the next report."""

import sys
from pathlib import Path

from dagster import AssetExecutionContext

from assets.resources import CrucibleResource
from datastore.trackers import how_to_open, report, tracker_root
from training.experiment import ExperimentConfig


def report_to_trackers(context: AssetExecutionContext, crucible: CrucibleResource, experiment: ExperimentConfig) -> None:
    if not experiment.report_to:
        return
    root = tracker_root(crucible.storage_root, crucible.checkpoint_root)
    failures = report(experiment.name, experiment.report_to, crucible.storage_root, root)
    for tracker, reason in failures.items():
        context.log.warning(f"{tracker} was not told this iteration's numbers ({reason}); the next report writes them")
    commands = how_to_open(root, Path(sys.executable).parent)
    for tracker in experiment.report_to:
        if tracker not in failures:
            context.log.info(f"reported to {tracker}; to open it: {commands[tracker]}")
