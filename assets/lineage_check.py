"""The `lineage_current` check of `checkpoint`: it marks the checkpoints trained on a lineage whose
start has since been replaced (by a re-run of an earlier iteration, or a rebuilt base policy).
Dagster maps a partition to an earlier one only on a time dimension, so it draws no edge from
checkpoint N-1 to iteration N and its own staleness cannot show this."""

from dagster import AssetCheckEvaluation, AssetCheckSeverity, AssetKey, DagsterInstance

from assets.partitions import iteration_key

LINEAGE_CHECK = "lineage_current"
LINEAGE_CHECK_DESCRIPTION = ("trained from the checkpoint before it as that one is now; a re-run of an earlier "
                             "iteration, or a rebuilt base policy, fails this check on every later one until they "
                             "are run again")


def report_off_lineage(instance: DagsterInstance, experiment: str, replaced_by: str, first: int,
                       later: list[int]) -> None:
    """Fail the check on each of `later`'s checkpoints: `replaced_by` replaced their lineage's start."""
    for number in later:
        instance.report_runless_asset_event(AssetCheckEvaluation(
            asset_key=AssetKey("checkpoint"), check_name=LINEAGE_CHECK, passed=False,
            partition=str(iteration_key(experiment, number)), severity=AssetCheckSeverity.WARN,
            description=f"trained from a lineage that {replaced_by} replaced: materialize iterations {first} to "
                        f"{number} again, in order"))
