"""What one iteration asset hands the next (sampled tasks, rollouts, graded rollouts), stored as
Parquet under the storage root, so that any asset of an iteration can be re-materialized alone
from the UI, in a later run, in another process or on another machine.

Each output is one part (named after its asset) of the `outputs` dataset's partition
`experiment=…/iteration=…`, one row per item: its JSON, written and read by pydantic through the
Python type the asset declares (`list[Task]`, `list[Rollout]`, …), so a stored value comes back
as the same objects, and a value that no longer fits its type is refused with the field that
does not.
"""

from __future__ import annotations

import functools
import typing

from dagster import ConfigurableIOManager, Failure, InputContext, OutputContext
from pydantic import TypeAdapter, ValidationError

from assets.failure_policy import failure_policy
from assets.partitions import parse_iteration_key
from datastore.store import DatasetStore, rows_to_table
from task_sets.schema import Task, TaskBase


class DatasetIOManager(ConfigurableIOManager):
    storage_root: str = ".crucible/data"

    def handle_output(self, context: OutputContext, obj: list) -> None:
        experiment, number = parse_iteration_key(context.asset_partition_key)
        rows = [{"index": index, "record": _adapter(type(value)).dump_json(value, exclude_computed_fields=True).decode()}
                for index, value in enumerate(obj)]
        store = DatasetStore(self.storage_root)
        with failure_policy(store):
            path = store.write_partition("outputs", experiment, number, rows_to_table("outputs", rows),
                                         part=context.asset_key.to_user_string())
        context.add_output_metadata({"stored_as": store.uri_of(path)})

    def load_input(self, context: InputContext) -> list:
        asset = context.asset_key.to_user_string()
        experiment, number = parse_iteration_key(context.asset_partition_key)
        store = DatasetStore(self.storage_root)
        with failure_policy(store):
            if not store.has_partition("outputs", experiment, number, part=asset):
                raise Failure(f"{asset} of {experiment} iteration {number} was never stored: materialize it first "
                              "(or the whole iteration)", allow_retries=False)
            rows = sorted(store.read_partition("outputs", experiment, number, part=asset).to_pylist(),
                          key=lambda row: row["index"])
        item = _adapter(_item_type(context.dagster_type.typing_type, asset))
        try:
            return [item.validate_json(row["record"]) for row in rows]
        except ValidationError as error:
            problem = error.errors()[0]
            raise Failure(f"the stored {asset} of {experiment} iteration {number} no longer fits the type its "
                          f"reader declares ({problem['loc']}: {problem['msg']}): materialize it again",
                          allow_retries=False) from None


# Dagster types an input by a class, so assets take `list[TaskBase]`; a task is read back as the
# kind it is (the `Task` union of function and repository tasks).
_READ_AS = {TaskBase: Task}


@functools.cache
def _adapter(item_type: object) -> TypeAdapter:
    return TypeAdapter(_READ_AS.get(item_type, item_type))


def _item_type(declared: object, asset: str) -> object:
    """X of the `list[X]` an asset takes."""
    if typing.get_origin(declared) is not list:
        raise TypeError(f"an input {asset} typed {declared!r}: the dataset IO manager loads lists of typed items")
    return typing.get_args(declared)[0]
