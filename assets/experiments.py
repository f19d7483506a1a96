"""store_experiment (the create_experiment job, pipelines/jobs.py): an experiment created from the UI's launchpad, its settings given as the
run config and validated exactly as `crucible run --config FILE` validates a file."""

from dagster import Config, Failure, OpExecutionContext, op
from pydantic import Field

from assets.partitions import add_experiment
from assets.resources import CrucibleResource
from training.experiment import ExperimentFileError, parse_experiment, updated_settings


class ExperimentSettings(Config):
    settings: str = Field(description="the experiment, as an experiment file in TOML (the settings of "
                          "training/experiment.py, `name` included)")


@op
def store_experiment(context: OpExecutionContext, config: ExperimentSettings, crucible: CrucibleResource) -> None:
    """Store the settings (refused, with the field and reason, when they do not validate or would
    change a stored experiment's more than how long it runs) and add its partition."""
    try:
        experiment = parse_experiment(config.settings, "toml", "the launchpad's settings", required=("name",))
        stored = crucible.experiment(experiment.name) if crucible.experiment_exists(experiment.name) else None
        experiment = updated_settings(stored, experiment)
    except ExperimentFileError as error:
        raise Failure(str(error), allow_retries=False) from None
    crucible.save_experiment(experiment)
    add_experiment(context.instance, experiment.name)
    context.log.info(f"experiment {experiment.name!r} stored: materialize its base_policy partition, then its "
                     f"iterations ({experiment.iterations} at most)")
