"""Continuous training: start iteration N+1 once checkpoint N exists."""

from dagster import (
    AssetKey,
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.partitions import iteration_key, iterations, parse_iteration_key
from assets.resources import CrucibleResource
from pipelines.jobs import iteration_job
from training.experiment import ExperimentFileError


def latest_iterations(context: SensorEvaluationContext, partition_keys: list[str]) -> dict[str, int]:
    """Highest iteration of every experiment among the partition keys; a malformed key (added by
    hand in the UI) is reported in the tick's log and skipped, never failing every tick."""
    latest: dict[str, int] = {}
    for key in partition_keys:
        try:
            experiment, iteration = parse_iteration_key(key)
        except ValueError as error:
            context.log.warning(f"skipped: {error}")
            continue
        latest[experiment] = max(iteration, latest.get(experiment, 0))
    return latest


def _limit(context: SensorEvaluationContext, crucible: CrucibleResource, experiment: str) -> int:
    """The experiment's `iterations` setting; 0 (not advanced, the rest still are) when it has no
    stored settings or they no longer validate."""
    if not crucible.experiment_exists(experiment):
        context.log.warning(f"not advancing {experiment!r}: it has no stored settings")
        return 0
    try:
        return crucible.experiment(experiment).iterations
    except ExperimentFileError as error:
        context.log.warning(f"not advancing {experiment!r}: {error}")
        return 0


# Stopped by default: `crucible run` drives iterations itself; turn this on in the UI to let an
# experiment continue on its own up to its `iterations` setting.
@sensor(job=iteration_job, minimum_interval_seconds=15, default_status=DefaultSensorStatus.STOPPED)
def advance_iteration(context: SensorEvaluationContext, crucible: CrucibleResource):
    existing = context.instance.get_dynamic_partitions(iterations.name)
    trained = context.instance.get_materialized_partitions(AssetKey("checkpoint"))
    next_keys = [
        iteration_key(experiment, iteration + 1)
        for experiment, iteration in latest_iterations(context, existing).items()
        if iteration_key(experiment, iteration) in trained and iteration < _limit(context, crucible, experiment)
    ]
    if not next_keys:
        return SkipReason("no experiment has a new checkpoint below its iteration limit")
    return SensorResult(
        run_requests=[RunRequest(run_key=key, partition_key=key) for key in next_keys],
        dynamic_partitions_requests=[iterations.build_add_request(next_keys)],
    )
