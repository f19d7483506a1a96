"""An experiment's numbers in the trackers it names (`report_to`): what TensorBoard's own event
reader and MLflow's client read back is, step for step, what the catalog's views say; a report
made again adds nothing; an iteration materialized again replaces its points; and each tracker's
own UI, served on loopback, shows the runs in Debian's chromium."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from conftest import skip_unless_required
from dagster import build_asset_context
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
from test_datastore import trajectory_row
from test_orchestration import CHROMIUM, CHROMIUM_ARGS

from assets.resources import CrucibleResource
from assets.trackers import report_to_trackers
from datastore import catalog, metrics
from datastore.schema import DATASETS
from datastore.store import DatasetStore, rows_to_table
from datastore.trackers import how_to_open, mlflow_store, report, tensorboard_logdir, tracker_root
from datastore.trackers.mlflow_runs import EXPERIMENT_TAG, MLFLOW_EXPERIMENT
from training.experiment import ExperimentConfig

BOTH = ("tensorboard", "mlflow")
STEPS_PER_ITERATION = 3
SHOTS = Path("/tmp/crucible-shots")  # a copy of each UI's screenshot, for the team's notes


def _row(dataset: str, **values) -> dict:
    """A row of `dataset` with `values`, every other column null."""
    return {**dict.fromkeys(DATASETS[dataset].names), **values}


def store_iteration(root: str, experiment: str, iteration: int, loss_offset: float = 0.0) -> None:
    """What an iteration stores: samples, optimizer steps, its checkpoint, held-out evaluations
    shown and blanked, stage times; the base policy's evaluation (iteration 0) with the first."""
    store = DatasetStore(root)
    samples = [trajectory_row(f"t/{i}", i, float(i % 2 or iteration > 1)) for i in range(4)]
    store.write_partition("trajectories", experiment, iteration, rows_to_table("trajectories", samples))
    steps = [_row("training_steps", step=step, loss=0.5 / step + loss_offset, clip_fraction=0.01 * step,
                  approx_kl=1e-3 * step, kl_to_reference=0.0, entropy=1.5 - 0.1 * step, grad_norm=0.3 * step,
                  lr=3e-4, tokens=100 * step + iteration) for step in range(1, STEPS_PER_ITERATION + 1)]
    store.write_partition("training_steps", experiment, iteration, rows_to_table("training_steps", steps))
    checkpoint = _row("checkpoints", path=f"/c/{iteration}", global_step=STEPS_PER_ITERATION * iteration,
                      final_kl=2e-3, entropy=1.3, grad_norm=0.6, tokens_per_s=1000.0 + iteration, blocked=False)
    store.write_partition("checkpoints", experiment, iteration, rows_to_table("checkpoints", [checkpoint]))
    for evaluated in ((0, iteration) if iteration == 1 else (iteration,)):
        rows = [_row("evaluations", task_id=f"e/{task}", sample_index=0, reward_status="scored", observations=shown,
                     passed=bool((task + evaluated) % 2 or (shown == "shown" and task < evaluated)), turns=[])
                for task in range(4) for shown in ("shown", "blanked")]
        store.write_partition("evaluations", experiment, evaluated, rows_to_table("evaluations", rows))
    started = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    for stage, seconds in (("rollouts", 3.0 * iteration), ("checkpoint", 5.0)):
        row = {"stage": stage, "seconds": seconds, "started_at": started}
        store.write_partition("stages", experiment, iteration, rows_to_table("stages", [row]), part=stage)


def views_say(root: str, experiment: str) -> dict[str, list[tuple[int, float]]]:
    """Every (step, value) of each tag, as the views hold them: optimizer steps counted on from
    the earlier iterations' (STEPS_PER_ITERATION each), the run summary by iteration."""
    con = catalog.connect(root)
    said: dict[str, list[tuple[int, float]]] = {}
    for row in metrics.records(con, "SELECT * FROM training_steps WHERE experiment = ? ORDER BY iteration, step",
                               [experiment]):
        step = STEPS_PER_ITERATION * (row["iteration"] - 1) + row["step"]
        for name in ("loss", "clip_fraction", "approx_kl", "kl_to_reference", "entropy", "grad_norm", "lr", "tokens"):
            said.setdefault(f"train/{name}", []).append((step, float(row[name])))
    for row in metrics.records(con, "SELECT * FROM iterations WHERE experiment = ? ORDER BY iteration", [experiment]):
        for name, value in row.items():
            if name not in ("experiment", "iteration") and value is not None:
                said.setdefault(f"iteration/{name}", []).append((row["iteration"], float(value)))
    return said


def tensorboard_says(root: Path, experiment: str) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(tensorboard_logdir(root) / experiment), size_guidance={SCALARS: 0}).Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def mlflow_run(root: Path, experiment: str):
    client = MlflowClient(mlflow_store(root)[0])
    [run] = client.search_runs([client.get_experiment_by_name(MLFLOW_EXPERIMENT).experiment_id],
                               filter_string=f"tags.`{EXPERIMENT_TAG}` = '{experiment}'")
    return client, run


def mlflow_says(root: Path, experiment: str) -> dict[str, list[tuple[int, float]]]:
    client, run = mlflow_run(root, experiment)
    return {tag: sorted((metric.step, metric.value) for metric in client.get_metric_history(run.info.run_id, tag))
            for tag in run.data.metrics}


def as_float32(said: dict[str, list[tuple[int, float]]]) -> dict:
    """TensorBoard keeps a scalar as a 32-bit float."""
    return {tag: [(step, pytest.approx(value, rel=1e-6)) for step, value in points] for tag, points in said.items()}


@pytest.fixture
def two_experiments(tmp_path) -> tuple[str, Path]:
    """Experiments alpha and beta, two iterations each, reported after each iteration."""
    root, trackers = str(tmp_path / "data"), tmp_path / "data" / "trackers"
    for iteration in (1, 2):
        for experiment in ("alpha", "beta"):
            store_iteration(root, experiment, iteration, loss_offset=0.1 if experiment == "beta" else 0.0)
            assert report(experiment, BOTH, root, trackers) == {}
    return root, trackers


def test_tensorboard_reads_back_every_point_the_views_hold(two_experiments):
    root, trackers = two_experiments
    for experiment in ("alpha", "beta"):
        assert tensorboard_says(trackers, experiment) == as_float32(views_say(root, experiment))


def test_mlflow_reads_back_every_point_the_views_hold(two_experiments):
    root, trackers = two_experiments
    for experiment in ("alpha", "beta"):
        assert mlflow_says(trackers, experiment) == views_say(root, experiment)


def test_the_views_say_what_the_reports_are_checked_against(two_experiments):
    """The points both trackers are compared with: six optimizer steps on one axis, the held-out
    curve from the base policy (iteration 0) with its standard error, sampled tokens, throughput."""
    said = views_say(*two_experiments[:1], "alpha")
    assert [step for step, _ in said["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in said["iteration/eval_pass_rate"]] == [0, 1, 2]
    assert {"iteration/eval_stderr", "iteration/reward_mean", "iteration/pass_rate", "iteration/sampled_tokens",
            "iteration/train_tokens_per_s", "iteration/eval_blanked_pass_rate"} <= said.keys()


def test_two_experiments_are_two_runs_that_overlay(two_experiments):
    """One TensorBoard run directory and one MLflow run (named after it) per experiment, in one
    MLflow experiment."""
    _, trackers = two_experiments
    assert sorted(path.name for path in tensorboard_logdir(trackers).iterdir()) == ["alpha", "beta"]
    client = MlflowClient(mlflow_store(trackers)[0])
    runs = client.search_runs([client.get_experiment_by_name(MLFLOW_EXPERIMENT).experiment_id])
    assert sorted(run.info.run_name for run in runs) == ["alpha", "beta"]


def test_reporting_again_adds_no_point(two_experiments):
    root, trackers = two_experiments
    files = sorted((tensorboard_logdir(trackers) / "alpha").iterdir())
    _, before = mlflow_run(trackers, "alpha")
    assert report("alpha", BOTH, root, trackers) == {}
    assert sorted((tensorboard_logdir(trackers) / "alpha").iterdir()) == files
    assert tensorboard_says(trackers, "alpha") == as_float32(views_say(root, "alpha"))
    _, after = mlflow_run(trackers, "alpha")
    assert after.info.run_id == before.info.run_id
    assert mlflow_says(trackers, "alpha") == views_say(root, "alpha")


def test_an_iteration_materialized_again_replaces_its_points(two_experiments):
    root, trackers = two_experiments
    store_iteration(root, "alpha", 1, loss_offset=1.0)
    assert report("alpha", BOTH, root, trackers) == {}
    said = views_say(root, "alpha")
    assert said["train/loss"][0] == (1, 1.5)
    assert tensorboard_says(trackers, "alpha") == as_float32(said)
    assert mlflow_says(trackers, "alpha") == said


def test_a_tracker_that_cannot_be_written_costs_a_warning_not_the_iteration(tmp_path, capfd):
    """At the end of an iteration (checkpoint_eval), a tracker that fails is named in one warning
    and the others are written."""
    crucible = CrucibleResource(storage_root=str(tmp_path / "data"), checkpoint_root=str(tmp_path / "checkpoints"))
    store_iteration(crucible.storage_root, "alpha", 1)
    trackers = tracker_root(crucible.storage_root, crucible.checkpoint_root)
    trackers.mkdir(parents=True)
    tensorboard_logdir(trackers).write_text("a file where the event files' folder would be")
    with build_asset_context() as context:
        report_to_trackers(context, crucible, ExperimentConfig(name="alpha", report_to=list(BOTH)))
    [warning] = [line for line in capfd.readouterr().err.splitlines() if " - WARNING - " in line]
    assert "tensorboard was not told this iteration's numbers (NotADirectoryError" in warning
    assert warning.endswith("; the next report writes them")
    assert mlflow_says(trackers, "alpha") == views_say(crucible.storage_root, "alpha")


def test_trackers_live_under_a_local_storage_root_else_beside_the_checkpoints(tmp_path):
    assert tracker_root(str(tmp_path / "data"), str(tmp_path / "c")) == tmp_path / "data" / "trackers"
    assert tracker_root("s3://bucket/data", str(tmp_path / "c")) == tmp_path / "c" / "trackers"


def free_port() -> int:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return listener.getsockname()[1]


@contextlib.contextmanager
def serving(tracker: str, trackers: Path, health: str, log: Path, timeout_s: float = 120) -> Iterator[str]:
    """The tracker's UI, served by the very command users are told (`crucible ui` prints it), on a
    free loopback port, once its `health` path answers; the server (and its workers) stopped after."""
    port = free_port()
    command = f"{how_to_open(trackers, Path(sys.executable).parent)[tracker]} --port {port}"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as output:
        server = subprocess.Popen(["bash", "-c", command], stdout=output, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    if requests.get(url + health, timeout=2).ok:
                        break
                except requests.ConnectionError:
                    pass
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.5)
            yield url
        finally:
            os.killpg(server.pid, signal.SIGTERM)  # the session it was started in: bash, the server, its workers
            server.wait(timeout=30)


@contextlib.contextmanager
def chromium_page(url: str) -> Iterator:
    """The page at `url` in Debian's chromium (never a downloaded browser)."""
    if not CHROMIUM.exists():
        skip_unless_required("browser", f"no {CHROMIUM}: scripts/install-system-packages browser installs it")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url)
            yield page
        finally:
            browser.close()


def keep_screenshot(page, shot: Path) -> None:
    page.screenshot(path=shot)
    SHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, SHOTS / shot.name)


@pytest.mark.slow
def test_the_mlflow_ui_overlays_the_two_runs_on_a_metric(two_experiments, tmp_path):
    _, trackers = two_experiments
    _, run = mlflow_run(trackers, "alpha")
    with serving("mlflow", trackers, "/health", tmp_path / "mlflow-server.log") as url, \
            chromium_page(f"{url}/#/experiments/{run.info.experiment_id}/runs?compareRunsMode=CHART") as page:
        from playwright.sync_api import expect

        page.get_by_role("button", name="Close", exact=True).click()  # MLflow's assistant panel, beside the charts
        page.get_by_placeholder("Search metric charts").fill("train/loss")
        for experiment in ("alpha", "beta"):
            expect(page.get_by_role("link", name=experiment)).to_be_visible(timeout=60_000)  # the runs
            expect(page.get_by_text(f"{experiment} (train/loss)").first).to_be_visible()  # their lines
        expect(page.locator(".js-plotly-plot").first).to_be_visible()  # the chart drawn
        keep_screenshot(page, tmp_path / "mlflow.png")


@pytest.mark.slow
def test_the_tensorboard_ui_overlays_the_two_runs_on_a_metric(two_experiments, tmp_path):
    _, trackers = two_experiments
    with serving("tensorboard", trackers, "/data/runs", tmp_path / "tensorboard.log") as url:
        assert sorted(requests.get(f"{url}/data/runs", timeout=10).json()) == ["alpha", "beta"]
        with chromium_page(f"{url}/#timeseries") as page:
            from playwright.sync_api import expect

            page.locator("input[placeholder='Filter tags (regex)']").fill("train/loss|eval_pass_rate")
            for text in ("/loss", "/eval_pass_rate", "alpha", "beta"):
                expect(page.get_by_text(text).first).to_be_visible(timeout=60_000)
            page.get_by_role("button", name="Toggle settings side pane").click()
            keep_screenshot(page, tmp_path / "tensorboard.png")
