"""reward_analytics: per-iteration summary of every experiment, straight from DuckDB."""

from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset

from assets.charts import markdown_table, png_markdown, reward_curve_png
from assets.iteration import checkpoint_eval, trajectories
from assets.resources import CrucibleResource
from datastore import catalog

SUMMARY_COLUMNS = ("experiment", "iteration", "tasks", "samples", "pass_rate", "mean_reward",
                   "generated_tokens", "eval_pass_rate", "eval_stderr")


@asset(group_name="analytics", deps=[trajectories, checkpoint_eval], kinds={"duckdb"})
def reward_analytics(context: AssetExecutionContext, crucible: CrucibleResource) -> MaterializeResult:
    """Pass rate, reward and held-out evaluation across all iterations of all experiments."""
    con = catalog.connect(crucible.storage_root)
    result = con.execute("SELECT * FROM iterations")
    names = [d[0] for d in result.description]
    rows = [dict(zip(names, values)) for values in result.fetchall()]
    context.log.info(f"{len(rows)} iterations summarised")
    return MaterializeResult(
        metadata={
            "iterations": len(rows),
            "summary": MetadataValue.md(markdown_table(rows, SUMMARY_COLUMNS)),
            "reward_curve": MetadataValue.md(png_markdown("reward curve", reward_curve_png(rows))),
        }
    )
