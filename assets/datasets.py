"""The datasets iteration assets write beside their own results, declared so that Dagster's
lineage and catalog show them: `datasets/<name>`, partitioned like the iteration, downstream of
the asset that writes it. They are written by that asset's run (never materialized on their own),
which reports each partition it stores."""

from dagster import AssetExecutionContext, AssetKey, AssetMaterialization, AssetSpec, MetadataValue

from assets.partitions import iterations
from datastore.store import DatasetStore

WRITTEN_BY = {
    "tasks": ("task_set", "every task of the set, as the iteration saw it: sampled or not"),
    "checkpoints": ("checkpoint", "the training step's record: lineage, health signals, verdicts"),
    "training_steps": ("checkpoint", "one row per optimizer step"),
    "evaluations": ("checkpoint_eval", "every held-out answer, graded"),
}

DATASET_ASSETS = [
    AssetSpec(AssetKey(["datasets", name]), deps=[writer], description=f"{description} (written by {writer})",
              partitions_def=iterations, group_name="datasets", kinds={"parquet"})
    for name, (writer, description) in WRITTEN_BY.items()
]


def report_stored(context: AssetExecutionContext, store: DatasetStore, dataset: str, experiment: str,
                  number: int) -> None:
    """Record in the instance that this run stored `dataset`'s partition of the iteration."""
    files = store.partition_files(dataset, experiment, number)
    context.log_event(AssetMaterialization(
        asset_key=AssetKey(["datasets", dataset]), partition=context.partition_key,
        metadata={"path": MetadataValue.path(files[0]), "files": len(files)}))
