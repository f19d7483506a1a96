"""The experiment trackers an experiment reports to (its `report_to`, as TRL's setting):
TensorBoard event files and an MLflow store, both plain local files that work offline.

A report makes every named tracker show what the catalog's views say of the experiment now
(datastore/trackers/points.py), writing only the iterations it does not show yet, or shows
otherwise (materialized again since): reporting twice adds nothing. Where they live:

    <storage root>/trackers/      when the storage root is a local directory
    <checkpoint root>/trackers/   when it is remote (s3://…): the local directory a run already
                                  shares with its containers and pods
      tensorboard/<experiment>/   one TensorBoard run per experiment (tensorboard --logdir …/tensorboard)
      mlflow/mlflow.db            MLflow's SQLite store (mlflow ui --backend-store-uri sqlite:///…),
                                  one run per experiment in the MLflow experiment `crucible`
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from datastore import catalog
from datastore.trackers.points import IterationPoints, experiment_points

Tracker = Literal["tensorboard", "mlflow"]


def tracker_root(storage_root: str, checkpoint_root: str) -> Path:
    """The local directory the trackers write under, for these storage and checkpoint roots."""
    local = "://" not in storage_root or storage_root.startswith("file://")
    return Path(storage_root.removeprefix("file://") if local else checkpoint_root).resolve() / "trackers"


def tensorboard_logdir(root: Path) -> Path:
    return root / "tensorboard"


def mlflow_database(root: Path) -> Path:
    return root / "mlflow" / "mlflow.db"


def mlflow_store(root: Path) -> tuple[str, Path]:
    """MLflow's tracking URI under `root`, and the folder its runs' artifacts would go to. SQLite:
    MLflow 3 deprecates its file store and makes a SQLite file its default store."""
    return f"sqlite:///{mlflow_database(root)}", root / "mlflow" / "artifacts"


def how_to_open(root: Path, bin_dir: Path) -> dict[str, str]:
    """The command that serves each tracker written under `root` on loopback, by tracker name
    (`bin_dir`: where this Python's scripts are)."""
    commands = {
        "tensorboard": (tensorboard_logdir(root), f"{bin_dir / 'tensorboard'} --logdir {tensorboard_logdir(root)} "
                                                  "--host 127.0.0.1"),
        # The UI's usage telemetry would try to reach MLflow's servers.
        "mlflow": (mlflow_database(root), f"MLFLOW_DISABLE_TELEMETRY=true {bin_dir / 'mlflow'} ui "
                                          f"--backend-store-uri {mlflow_store(root)[0]} --host 127.0.0.1"),
    }
    return {tracker: command for tracker, (written, command) in commands.items() if written.exists()}


def report(experiment: str, trackers: Sequence[str], storage_root: str, root: Path) -> dict[str, str]:
    """Report `experiment`'s numbers to each of `trackers` under `root`; returns why each tracker
    that could not be written was not (nothing is lost: the next report writes what it missed)."""
    trackers = list(dict.fromkeys(trackers))
    # A tracker holds a copy of what is stored: no failure here, whatever raised it, stops an iteration.
    try:
        iterations = experiment_points(catalog.connect(storage_root), experiment)
    except Exception as error:  # noqa: BLE001  the views unreadable: no tracker can be told anything
        return dict.fromkeys(trackers, _reason(error))
    failures = {}
    for tracker in trackers:
        try:
            WRITERS[tracker](root, experiment, iterations)
        except Exception as error:  # noqa: BLE001  MLflow's, SQLite's, protobuf's and OS errors alike
            failures[tracker] = _reason(error)
    return failures


def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


# Each imports its library when called only: MLflow alone takes 1.5 s to import.
def _tensorboard(root: Path, experiment: str, iterations: dict[int, IterationPoints]) -> None:
    from datastore.trackers.tensorboard_files import write_run

    write_run(tensorboard_logdir(root) / experiment, iterations)


def _mlflow(root: Path, experiment: str, iterations: dict[int, IterationPoints]) -> None:
    from datastore.trackers.mlflow_runs import write_run

    write_run(*mlflow_store(root), experiment, iterations)


WRITERS = {"tensorboard": _tensorboard, "mlflow": _mlflow}
