"""An experiment's MLflow run: one run per experiment, named after it, in the MLflow experiment
`crucible`, so that experiments overlay in one comparison.

Each iteration's points are logged once, followed by a tag holding their fingerprint. MLflow
cannot remove a logged point, so when an iteration's points are no longer what its tag says (it
was materialized again, or a report died while logging it), the run is replaced by a new one
holding what the views say now; the old one goes to MLflow's deleted runs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

# Crucible runs offline: MLflow's usage telemetry, started when it is imported, would try to reach
# its servers from a thread of its own.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.entities import Metric, Run  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from datastore.trackers.points import IterationPoints  # noqa: E402

# A store's first use creates its tables and says so, as MLflow's and alembic's INFO lines on stderr.
for noisy in ("mlflow", "alembic"):
    logging.getLogger(noisy).setLevel(logging.WARNING)

MLFLOW_EXPERIMENT = "crucible"
EXPERIMENT_TAG = "crucible.experiment"
ITERATION_TAG = "crucible.iteration."  # + the iteration: the fingerprint of the points logged for it
LOGGING = "logging"  # an iteration tag's value while its points are being logged


def write_run(tracking_uri: str, artifacts: Path, experiment: str, iterations: Mapping[int, IterationPoints]) -> None:
    """Make `experiment`'s run hold exactly `iterations`' points."""
    client = MlflowClient(tracking_uri)
    experiment_id = _experiment_id(client, artifacts)
    run = _current_run(client, experiment_id, experiment)
    logged = {} if run is None else _logged(run)
    if run is None or any(iteration not in iterations or iterations[iteration].fingerprint != fingerprint
                          for iteration, fingerprint in logged.items()):
        if run is not None:
            client.delete_run(run.info.run_id)
        run, logged = client.create_run(experiment_id, run_name=experiment, tags={EXPERIMENT_TAG: experiment}), {}
    run_id, now_ms = run.info.run_id, int(time.time() * 1000)
    for iteration, points in sorted(iterations.items()):
        if iteration in logged:
            continue
        tag = f"{ITERATION_TAG}{iteration}"
        client.set_tag(run_id, tag, LOGGING)
        client.log_batch(run_id, metrics=[Metric(p.tag, p.value, now_ms, p.step) for p in points.points])
        client.set_tag(run_id, tag, points.fingerprint)
    client.set_terminated(run_id)  # as of this report; the next one logs to it again


def _experiment_id(client: MlflowClient, artifacts: Path) -> str:
    """The `crucible` experiment's id, created (its artifacts under `artifacts`, not ./mlruns)
    on first use."""
    found = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
    if found is None:
        try:
            return client.create_experiment(MLFLOW_EXPERIMENT, artifact_location=artifacts.as_uri())
        except MlflowException:  # another experiment's report created it first
            found = client.get_experiment_by_name(MLFLOW_EXPERIMENT)
            if found is None:
                raise
    return found.experiment_id


def _current_run(client: MlflowClient, experiment_id: str, experiment: str) -> Run | None:
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{EXPERIMENT_TAG}` = '{experiment}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def _logged(run: Run) -> dict[int, str]:
    """The iterations the run says it holds, and the fingerprint each was logged with."""
    return {int(key.removeprefix(ITERATION_TAG)): value for key, value in run.data.tags.items()
            if key.startswith(ITERATION_TAG)}
