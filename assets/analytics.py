"""reward_analytics: per-iteration summary of every experiment, straight from DuckDB."""

import base64
import io

import matplotlib

matplotlib.use("Agg")  # no display: render to PNG bytes
import matplotlib.pyplot as plt
from dagster import AssetExecutionContext, MaterializeResult, MetadataValue, asset
from matplotlib.ticker import MaxNLocator

from assets.iteration import checkpoint_eval, trajectories
from assets.resources import CrucibleResource
from datastore import catalog

SUMMARY_COLUMNS = ("experiment", "iteration", "tasks", "samples", "pass_rate", "mean_reward",
                   "generated_tokens", "eval_pass_rate", "eval_stderr")


def reward_curve_png(rows: list[dict]) -> bytes:
    """Mean reward, train pass rate and held-out pass rate per iteration, one line per experiment."""
    figure, axis = plt.subplots(figsize=(7, 4), dpi=100)
    for experiment in sorted({row["experiment"] for row in rows}):
        points = [row for row in rows if row["experiment"] == experiment]
        x = [row["iteration"] for row in points]
        axis.plot(x, [row["mean_reward"] for row in points], marker="o", label=f"{experiment}: mean reward")
        axis.plot(x, [row["pass_rate"] for row in points], marker="s", label=f"{experiment}: train pass rate")
        evaluated = [row for row in points if row["eval_pass_rate"] is not None]
        axis.errorbar(
            [row["iteration"] for row in evaluated],
            [row["eval_pass_rate"] for row in evaluated],
            yerr=[row["eval_stderr"] for row in evaluated],
            marker="^", capsize=3, label=f"{experiment}: held-out pass rate",
        )
    axis.set(xlabel="iteration", ylabel="rate", ylim=(0, 1), title="Crucible reward curve")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def markdown_table(rows: list[dict], columns: tuple[str, ...]) -> str:
    def cell(value) -> str:
        return f"{value:.3f}" if isinstance(value, float) else ("" if value is None else str(value))

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


@asset(group_name="analytics", deps=[trajectories, checkpoint_eval], kinds={"duckdb"})
def reward_analytics(context: AssetExecutionContext, crucible: CrucibleResource) -> MaterializeResult:
    """Pass rate, reward and held-out evaluation across all iterations of all experiments."""
    con = catalog.connect(crucible.storage_root)
    result = con.execute("SELECT * FROM iterations")
    names = [d[0] for d in result.description]
    rows = [dict(zip(names, values)) for values in result.fetchall()]
    context.log.info(f"{len(rows)} iterations summarised")
    png = base64.b64encode(reward_curve_png(rows)).decode()
    return MaterializeResult(
        metadata={
            "iterations": len(rows),
            "summary": MetadataValue.md(markdown_table(rows, SUMMARY_COLUMNS)),
            "reward_curve": MetadataValue.md(f"![reward curve](data:image/png;base64,{png})"),
        }
    )
