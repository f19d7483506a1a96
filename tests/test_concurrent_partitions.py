"""Partition keys added by commands that run at once (two `crucible run`s, a run and a sensor)."""

from __future__ import annotations

import multiprocessing

from dagster import DagsterInstance

from assets.partitions import add_iteration, iteration_numbers

NUMBERS = range(1, 101)
WRITERS = 4


def _add_all(home: str, start) -> None:
    with DagsterInstance.local_temp(home) as instance:
        start.wait()
        for number in NUMBERS:
            add_iteration(instance, "exp", number)


def test_processes_adding_the_same_iterations_at_once_all_succeed(tmp_path):
    """Two `crucible run`s of one experiment added its next iteration at one moment; Dagster's SQLite
    storage looks, then inserts, and the second failed on the key's unique index (CI, stop 54)."""
    # Its tables, made once: instances opening a new folder at once would each migrate it.
    DagsterInstance.local_temp(str(tmp_path)).dispose()
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(WRITERS)
    writers = [context.Process(target=_add_all, args=(str(tmp_path), start)) for _ in range(WRITERS)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
    assert [writer.exitcode for writer in writers] == [0] * WRITERS
    with DagsterInstance.local_temp(str(tmp_path)) as instance:
        assert instance.get_dynamic_partitions(iteration_numbers.name) == [f"{n:04d}" for n in NUMBERS]
