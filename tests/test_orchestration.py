"""Iterations launched as an operator launches them (issue 16): a backfill from the Dagster UI's
own API with a real daemon and a run limit of 3, and two `crucible run` processes at once. Either
way every iteration samples from the previous checkpoint and trains from it, or is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml
from conftest import skip_unless_required
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, DagsterRunStatus, RunsFilter, materialize
from dagster_server import dagster_dev

from assets.partitions import add_iteration, experiments
from assets.policy import base_policy
from assets.resources import CrucibleResource
from assets.training_step import TrainingStepClient
from datastore.store import DatasetStore
from pipelines.jobs import ITERATION_ASSETS
from task_sets.importers.records import write_task_set
from task_sets.loader import load_task_set
from tests.lineage import EVERY_STEP_MOVES, assert_one_lineage
from training.experiment import BasePolicySettings, ExperimentConfig

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent
# An untrained tiny model gets every task wrong, so no group has a reward spread: zero-advantage
# samples kept and weight decay make every training step move the weights all the same, so each
# checkpoint differs from its parent and a wrong parent shows in the lineage (assert_one_lineage).
TINY = dict(tasks_per_iteration=3, samples_per_task=2, max_new_tokens=16, eval_tasks=2, eval_samples=1,
            refill_rounds=0, regrade_fraction=0.0, base=BasePolicySettings(hidden_size=32, num_layers=1, sft_steps=0),
            grpo=EVERY_STEP_MOVES)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("orchestration")


@pytest.fixture(scope="module")
def environment(workdir) -> dict[str, str]:
    home = workdir / "dagster"
    home.mkdir()
    settings = yaml.safe_load((ROOT / "pipelines" / "dagster.yaml").read_text())
    settings["concurrency"]["runs"]["max_concurrent_runs"] = 3  # as an operator running experiments side by side
    (home / "dagster.yaml").write_text(yaml.safe_dump(settings))
    return {**os.environ, "DAGSTER_HOME": str(home), "CRUCIBLE_STORAGE_ROOT": str(workdir / "data"),
            "CRUCIBLE_CHECKPOINT_ROOT": str(workdir / "checkpoints"), "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": str(ROOT)}


def instance_of(environment: dict[str, str]) -> DagsterInstance:
    return DagsterInstance.from_config(environment["DAGSTER_HOME"])


@pytest.fixture(scope="module")
def crucible(environment) -> CrucibleResource:
    return CrucibleResource(storage_root=environment["CRUCIBLE_STORAGE_ROOT"],
                            checkpoint_root=environment["CRUCIBLE_CHECKPOINT_ROOT"])


@pytest.fixture(scope="module")
def mini_set(workdir) -> str:
    compose = load_task_set("compose")
    write_task_set([*compose.train()[:6], *compose.eval()[:2]], workdir / "mini")
    return str(workdir / "mini")


def create_experiment(environment, crucible: CrucibleResource, name: str, task_set: str, max_staleness: int = 0) -> None:
    """Its settings stored and its base policy built, as `crucible run` does before iteration 1."""
    crucible.save_experiment(ExperimentConfig(name=name, task_set=task_set, max_staleness=max_staleness, **TINY))
    with instance_of(environment) as instance:
        instance.add_dynamic_partitions(experiments.name, [name])
        assert materialize([base_policy], partition_key=name, instance=instance,
                           resources={"crucible": crucible, "training_step": TrainingStepClient()}).success


def crucible_run(environment, name: str, iterations: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipelines.cli", "run", "--experiment", name, "--iterations",
                             str(iterations)], cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_two_crucible_runs_at_once_never_both_train_an_iteration(environment, crucible, mini_set):
    """Problem 2: `crucible run` went around the run queue; two of them (or one and a UI run)
    trained the same iteration into the same checkpoint folder. Run first in this module, before
    the UI's daemon: the two share the daemon one of them starts, and the other follows its runs."""
    create_experiment(environment, crucible, "twice", mini_set)
    first, second = crucible_run(environment, "twice", 2), crucible_run(environment, "twice", 2)
    outputs = [process.communicate(timeout=1200) for process in (first, second)]
    for process, (_, stderr) in zip((first, second), outputs):
        assert process.returncode == 0, stderr[-3000:]
    followed = [stderr for _, stderr in outputs if "already; following it" in stderr or "ours cancelled" in stderr]
    assert followed, "neither followed the other's run"
    with instance_of(environment) as instance:
        for number in (1, 2):
            partition = f"twice|{number:04d}"
            trained = instance.fetch_materializations(
                AssetRecordsFilter(AssetKey("checkpoint"), asset_partitions=[partition]), limit=10).records
            assert len(trained) == 1, partition
    assert_one_lineage(crucible, "twice", 2)
    assert DatasetStore(crucible.storage_root).has_partition("evaluations", "twice", 2)


def most_at_once(runs: list) -> int:
    """The most of these (finished) runs that were under way at one instant."""
    return max(sum(other.start_time <= run.start_time < other.end_time for other in runs) for run in runs)


def iteration_runs(environment, experiment: str) -> list:
    with instance_of(environment) as instance:
        records = instance.get_run_records(RunsFilter(job_name="iteration", tags={"dagster/partition/experiment": experiment}))
    return sorted(records, key=lambda record: record.dagster_run.tags["dagster/partition"])


def test_crucible_run_keeps_two_iterations_under_way_with_max_staleness_1(environment, crucible, mini_set):
    """Iteration 2 samples while 1 trains, from the base policy (one step stale), and trains
    from checkpoint 1 once it is recorded; 3 starts when 1 has ended, never beside both."""
    create_experiment(environment, crucible, "overlapped", mini_set, max_staleness=1)
    process = crucible_run(environment, "overlapped", 3)
    _, stderr = process.communicate(timeout=1200)
    assert process.returncode == 0, stderr[-3000:]
    runs = iteration_runs(environment, "overlapped")
    assert [run.dagster_run.status for run in runs] == [DagsterRunStatus.SUCCESS] * 3
    assert most_at_once(runs) == 2
    assert runs[2].start_time >= runs[0].end_time  # iteration 3 shares iteration 1's lane
    assert "[2] run " in stderr  # the lines of iterations under way at once are told apart
    assert assert_one_lineage(crucible, "overlapped", 3, max_staleness=1)[1] == 1


@pytest.fixture(scope="module")
def graphql(environment, workdir) -> Iterator[str]:
    with dagster_dev(environment, workdir / "dagster-dev.log") as url:
        yield f"{url}/graphql"


LAUNCH_BACKFILL = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
  }
}"""


def launch_asset_backfill(url: str, partition_keys: list[str]) -> str:
    """What the UI sends for "Materialize" of the iteration assets over a selection of partitions."""
    params = {"assetSelection": [{"path": [name]} for name in ITERATION_ASSETS], "partitionNames": partition_keys}
    reply = requests.post(url, json={"query": LAUNCH_BACKFILL, "variables": {"params": params}}, timeout=60).json()
    launched = reply["data"]["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    return launched["backfillId"]


FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


def wait_for_runs(environment, experiment: str, count: int, timeout_s: float = 1500) -> list:
    deadline = time.monotonic() + timeout_s
    with instance_of(environment) as instance:
        while time.monotonic() < deadline:
            runs = instance.get_run_records(RunsFilter(tags={"dagster/partition/experiment": experiment}))
            if len(runs) >= count and all(record.dagster_run.status in FINISHED for record in runs):
                return sorted(runs, key=lambda record: record.start_time or 0)
            time.sleep(2)
    pytest.fail(f"{count} runs of {experiment} did not finish within {timeout_s} s")


def test_a_backfill_of_two_iterations_runs_them_in_order_with_a_run_limit_of_3(
        environment, crucible, mini_set, graphql):
    """Problem 1: with max_concurrent_runs 3, a backfill of consecutive iterations ran them all at
    once, each from whatever checkpoint was on disk, and all showed green."""
    create_experiment(environment, crucible, "ordered", mini_set)
    with instance_of(environment) as instance:
        keys = [str(add_iteration(instance, "ordered", number)) for number in (1, 2)]
    launch_asset_backfill(graphql, keys)
    runs = wait_for_runs(environment, "ordered", len(keys))
    statuses = {record.dagster_run.tags["dagster/partition"]: record.dagster_run.status for record in runs}
    assert statuses == dict.fromkeys(keys, DagsterRunStatus.SUCCESS)
    for earlier, later in zip(runs, runs[1:]):  # one iteration of the experiment at a time, in order
        assert later.start_time >= earlier.end_time
    assert [record.dagster_run.tags["dagster/partition"] for record in runs] == keys
    assert_one_lineage(crucible, "ordered", 2)


def test_a_backfill_keeps_max_staleness_plus_one_iterations_under_way(environment, crucible, mini_set, graphql):
    """The queue's lanes, for a backfill from the UI: with max_staleness 1, two iterations of the
    experiment at a time, each within its bound, on one lineage."""
    create_experiment(environment, crucible, "backfilled", mini_set, max_staleness=1)
    with instance_of(environment) as instance:
        keys = [str(add_iteration(instance, "backfilled", number)) for number in (1, 2, 3)]
    launch_asset_backfill(graphql, keys)
    runs = wait_for_runs(environment, "backfilled", len(keys))
    assert [run.dagster_run.status for run in runs] == [DagsterRunStatus.SUCCESS] * 3
    assert {run.dagster_run.tags["crucible/lane"] for run in runs} == {"backfilled/0", "backfilled/1"}
    assert most_at_once(runs) == 2
    assert assert_one_lineage(crucible, "backfilled", 3, max_staleness=1)[1] == 1


CHROMIUM = Path("/usr/bin/chromium")  # Debian's (scripts/install-system-packages browser); never a download
# Flags for a machine without a network or a screen: no background services, no sandbox for root.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def launch_from_the_job_page(page, base_url: str, experiment: str, iterations: list[str], button: str) -> None:
    """The `iteration` job's "Materialize all", its partitions picked in the dialog's two dimensions."""
    from playwright.sync_api import expect
    page.goto(f"{base_url}/locations/pipelines.definitions/jobs/iteration")
    page.get_by_role("button", name="Materialize all").click()
    # The launch dialog is the modal one; a partition popover that is closing is a dialog too.
    launch_dialog = page.locator("[role=dialog][aria-modal=true]")
    launch_dialog.wait_for()
    for keys in ([experiment], iterations):  # the first unfilled dimension is the next one
        page.get_by_text("Select a partition or create one").first.click()
        for key in keys:
            page.get_by_placeholder("Filter partitions").fill(key)
            page.locator("label").filter(has_text=key).first.click()
        page.keyboard.press("Escape")
        # A popover still closing would leave two filter boxes for the next dimension.
        expect(page.get_by_placeholder("Filter partitions")).to_have_count(0)
    page.get_by_role("button", name=button).click()
    launch_dialog.wait_for(state="hidden")


def crucible_run_ids(environment, experiment: str) -> list[str]:
    """The iteration runs of `experiment` that succeeded (those made by `crucible run` above)."""
    with instance_of(environment) as instance:
        records = instance.get_run_records(RunsFilter(job_name="iteration", statuses=[DagsterRunStatus.SUCCESS],
                                                      tags={"dagster/partition/experiment": experiment}))
    assert len(records) == 2, [record.dagster_run.run_id for record in records]
    return [record.dagster_run.run_id for record in records]


def test_the_ui_launches_an_iteration_then_a_backfill_of_two_more_in_order(
        environment, crucible, mini_set, graphql, workdir):
    """A real browser (Debian's chromium, driven by Playwright) through the Dagster UI, as an
    operator clicks: one iteration, then a backfill of the next two; the job's runs page lists
    those `crucible run` made above beside them; screenshots are kept
    (CRUCIBLE_UI_SCREENSHOTS=DIR copies them there, as docs/ui's were made)."""
    if not CHROMIUM.exists():
        skip_unless_required("browser", f"no {CHROMIUM}: scripts/install-system-packages browser installs it")
    from playwright.sync_api import expect, sync_playwright

    create_experiment(environment, crucible, "clicked", mini_set)
    with instance_of(environment) as instance:
        for number in (1, 2, 3):
            add_iteration(instance, "clicked", number)
    base_url, shots = graphql.removesuffix("/graphql"), workdir / "screenshots"
    shots.mkdir()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        launch_from_the_job_page(page, base_url, "clicked", ["0001"], "Launch 1 run")
        # At once, while iteration 1 runs: the queue holds the backfill's runs behind it.
        launch_from_the_job_page(page, base_url, "clicked", ["0002", "0003"], "Launch backfill")
        runs = wait_for_runs(environment, "clicked", 3)
        crucible_runs = crucible_run_ids(environment, "twice")
        page.goto(f"{base_url}/locations/pipelines.definitions/jobs/iteration/runs")
        for run_id in crucible_runs:  # `crucible run`'s runs are listed under the job, as the UI's own are
            expect(page.get_by_text(run_id[:8], exact=True).first).to_be_visible()
        for name, path in (("runs", "/runs"), ("checkpoint-eval-partitions", "/assets/checkpoint_eval?view=partitions"),
                           ("lineage", "/assets/checkpoint?view=lineage")):
            page.goto(base_url + path)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=shots / f"{name}.png")
        browser.close()
    assert [record.dagster_run.tags["dagster/partition"] for record in runs] == [
        "clicked|0001", "clicked|0002", "clicked|0003"]
    assert {record.dagster_run.status for record in runs} == {DagsterRunStatus.SUCCESS}
    for earlier, later in zip(runs, runs[1:]):
        assert later.start_time >= earlier.end_time
    assert_one_lineage(crucible, "clicked", 3)
    if os.environ.get("CRUCIBLE_UI_SCREENSHOTS"):
        for shot in shots.iterdir():
            Path(os.environ["CRUCIBLE_UI_SCREENSHOTS"], shot.name).write_bytes(shot.read_bytes())
