"""What `crucible run` shows of a run it follows (pipelines/logging.py): an asset's own lines, those
of a process it runs through Dagster Pipes, failures, and none of the Pipes plumbing."""

from __future__ import annotations

import sys

from dagster import DagsterInstance, Definitions, PipesSubprocessClient, asset, define_asset_job

from pipelines.logging import shown

# The training step's shape (assets/train_process.py): a process that logs through its Pipes session.
# `ends`: "well", "raising" (an error in the step) or "unopened" (dead before Pipes opened).
STEP = """
import sys
from dagster_pipes import open_dagster_pipes
ends = sys.argv[1]
if ends == "unopened":
    sys.exit(1)
with open_dagster_pipes() as pipes:
    pipes.log.info("train step 1/1: loss 0.5")
    if ends == "raising":
        raise RuntimeError("CUDA out of memory")
"""


@asset(config_schema={"ends": str})
def checkpoint(context, pipes: PipesSubprocessClient):
    command = [sys.executable, "-c", STEP, context.op_execution_context.op_config["ends"]]
    return pipes.run(command=command, context=context).get_materialize_result()


def shown_lines(ends: str) -> list[str]:
    """The lines `crucible run` would show of the run, each without its time of day."""
    defs = Definitions(assets=[checkpoint], jobs=[define_asset_job("train", [checkpoint])],
                       resources={"pipes": PipesSubprocessClient()})
    with DagsterInstance.ephemeral() as instance:
        result = defs.resolve_job_def("train").execute_in_process(
            instance=instance, run_config={"ops": {"checkpoint": {"config": {"ends": ends}}}}, raise_on_error=False)
        lines = [shown(entry) for entry in instance.all_logs(result.run_id)]
    return [line.split(" ", 1)[1] for line in lines if line is not None]


def test_the_steps_lines_show_and_the_pipes_plumbing_does_not():
    lines = shown_lines(ends="well")
    assert lines == ["checkpoint: step start", "checkpoint: train step 1/1: loss 0.5", "checkpoint: step success"]


def test_a_failed_step_shows_as_failed():
    assert shown_lines(ends="raising")[-1] == "checkpoint: step failure"


def test_pipes_warnings_are_no_plumbing():
    warned = [line for line in shown_lines(ends="unopened") if "did not receive any messages" in line]
    assert warned and warned[0].startswith("checkpoint: [pipes] did not receive any messages from external process")
