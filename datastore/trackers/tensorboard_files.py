"""An experiment's TensorBoard run: its directory holds one event file per iteration, named by the
iteration and the fingerprint of its points. A report writes the files that are missing and
removes those no iteration names any more, so an iteration shown already is never written again,
and one materialized again replaces its old points instead of adding to them. TensorBoard reads a
run's files in name order, so the iterations' points follow each other on every axis.

Written with TensorBoard's own record format and protocol buffers (no TensorFlow, no torch).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from itertools import groupby
from pathlib import Path

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.record_writer import RecordWriter

from datastore.atomic import written_atomically
from datastore.trackers.points import IterationPoints

# TensorBoard reads any file whose name holds "tfevents" as an event file.
PREFIX = "events.out.tfevents.iteration-"
FILE_VERSION = "brain.Event:2"  # the version TensorBoard's own writers declare


def write_run(run_dir: Path, iterations: Mapping[int, IterationPoints]) -> None:
    """Make the run directory hold exactly `iterations`' points."""
    run_dir.mkdir(parents=True, exist_ok=True)
    wanted = {event_file_name(points): points for points in iterations.values()}
    for name, points in wanted.items():
        if not (run_dir / name).exists():
            _write(run_dir / name, points)
    for old in run_dir.glob(f"{PREFIX}*"):
        if old.name not in wanted:
            old.unlink()


def event_file_name(points: IterationPoints) -> str:
    return f"{PREFIX}{points.iteration:06d}.{points.fingerprint[:16]}"


def _write(path: Path, points: IterationPoints) -> None:
    now = time.time()
    with written_atomically(path) as partial, partial.open("wb") as file:
        records = RecordWriter(file)
        records.write(Event(wall_time=now, file_version=FILE_VERSION).SerializeToString())
        by_step = groupby(sorted(points.points, key=lambda point: point.step), key=lambda point: point.step)
        for step, at_step in by_step:
            values = [Summary.Value(tag=point.tag, simple_value=point.value) for point in at_step]
            records.write(Event(wall_time=now, step=step, summary=Summary(value=values)).SerializeToString())
