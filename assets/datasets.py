"""The datasets iteration assets write beside their own results, declared so that Dagster's
lineage and catalog show them: `datasets/<name>`, partitioned like the iteration, downstream of
the asset that writes it. They are written by that asset's run (never materialized on their own),
which reports each partition it stores."""

from dagster import AssetExecutionContext, AssetKey, AssetMaterialization, AssetSpec, MetadataValue

from assets.partitions import iterations
from datastore.schema import WRITTEN_BY
from datastore.store import DatasetStore

# The datasets shown in the asset graph beside the asset that writes them (datastore/schema.py's WRITTEN_BY).
SHOWN = {
    "tasks": "every task of the set, as the iteration saw it: sampled or not",
    "checkpoints": "the training step's record: lineage, health signals, verdicts",
    "training_steps": "one row per optimizer step",
    "evaluations": "every held-out answer, graded",
}

DATASET_ASSETS = [
    AssetSpec(AssetKey(["datasets", name]), deps=[WRITTEN_BY[name]],
              description=f"{description} (written by {WRITTEN_BY[name]})", partitions_def=iterations,
              group_name="datasets", kinds={"parquet"})
    for name, description in SHOWN.items()
]


def report_stored(context: AssetExecutionContext, store: DatasetStore, dataset: str, experiment: str,
                  number: int) -> None:
    """Record in the instance that this run stored `dataset`'s partition of the iteration."""
    files = store.partition_files(dataset, experiment, number)
    context.log_event(AssetMaterialization(
        asset_key=AssetKey(["datasets", dataset]), partition=context.partition_key,
        metadata={"path": MetadataValue.path(files[0]), "files": len(files)}))
