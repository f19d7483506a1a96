"""The progress console (pipelines/logging.py) as `crucible run` prints it: an asset's own lines,
those of a process it runs through Dagster Pipes, failures, and none of the Pipes plumbing."""

from __future__ import annotations

import logging
import sys

import pytest
from dagster import Definitions, PipesSubprocessClient, asset, define_asset_job

from pipelines.logging import progress_console

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


def run_step(ends: str) -> bool:
    defs = Definitions(assets=[checkpoint], jobs=[define_asset_job("train", [checkpoint])],
                       loggers={"console": progress_console}, resources={"pipes": PipesSubprocessClient()})
    result = defs.resolve_job_def("train").execute_in_process(
        run_config={"loggers": {"console": {"config": {"log_level": "INFO"}}},
                    "ops": {"checkpoint": {"config": {"ends": ends}}}},
        raise_on_error=False)
    return result.success


@pytest.fixture(autouse=True)
def fresh_console(monkeypatch, tmp_path):
    """The console's handler writes to the stderr of the test that made it: one per test."""
    monkeypatch.setattr(logging.getLogger("crucible.progress"), "handlers", [])
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))


def test_the_steps_lines_show_and_the_pipes_plumbing_does_not(capfd):
    assert run_step(ends="well")
    err = capfd.readouterr().err
    assert "checkpoint: train step 1/1: loss 0.5" in err
    assert "[pipes]" not in err


def test_a_failed_step_still_shows_its_error(capfd):
    assert not run_step(ends="raising")
    err = capfd.readouterr().err
    assert "RuntimeError: CUDA out of memory" in err  # the step's own traceback, on its stderr
    assert 'checkpoint: Execution of step "checkpoint" failed.' in err


def test_pipes_warnings_are_no_plumbing(capfd):
    assert not run_step(ends="unopened")
    assert "[pipes] did not receive any messages from external process" in capfd.readouterr().err
