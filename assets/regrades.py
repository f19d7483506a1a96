"""regrades[experiment|iteration]: a past iteration's submissions graded again, by the verifier and
reward function as they are now, stored beside the original (one part per reward version) so
that a new verifier never rewrites the trajectories a checkpoint was trained on. Launched from
the UI as a backfill over the iterations to re-grade; `crucible sql` shows both in `regraded`."""

import re
from collections import Counter

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from assets.failure_policy import failure_policy
from assets.iteration import ITERATION, this_iteration
from assets.resources import CrucibleResource
from datastore.store import rows_to_table
from training.iteration import regrading


@asset(**{**ITERATION, "group_name": "regrading"}, deps=["trajectories"])
def regrades(context: AssetExecutionContext, crucible: CrucibleResource) -> MaterializeResult:
    """The iteration's trained-on submissions graded again in fresh sandboxes, stored under the
    current reward version."""
    iteration = this_iteration(context, crucible)
    store = crucible.store()
    with failure_policy(store):
        regrade = regrading.regrade(iteration, crucible, context.log.info)
        rows = regrade.rows
        path = store.write_partition("regrades", iteration.name, iteration.number, rows_to_table("regrades", rows),
                                     part=re.sub(r"[^\w@.-]", "_", regrade.reward_version))
    return MaterializeResult(metadata={
        "path": MetadataValue.path(store.uri_of(path)), "reward_version": regrade.reward_version,
        "samples": len(rows), "pass_rate": sum(row["passed"] for row in rows) / max(len(rows), 1),
        "verdicts_changed": regrade.verdicts_changed,
        "statuses": MetadataValue.json(dict(Counter(row["reward_status"] for row in rows))),
    })
