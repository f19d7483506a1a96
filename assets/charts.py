"""Plots and tables for asset metadata and the README: PNG bytes and Markdown."""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")  # no display: render to PNG bytes
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator


def reward_curve_png(rows: list[dict]) -> bytes:
    """Mean reward, train pass rate and held-out pass rate per iteration, one line per experiment."""
    figure, axis = plt.subplots(figsize=(7, 4), dpi=100)
    for experiment in sorted({row["experiment"] for row in rows}):
        points = [row for row in rows if row["experiment"] == experiment]
        x = [row["iteration"] for row in points]
        axis.plot(x, [row["reward_mean"] for row in points], marker="o", label=f"{experiment}: mean reward")
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
    return _png(figure)


def reward_histogram_png(rewards: list[float], title: str) -> bytes:
    """How the scored samples' rewards are spread (all-or-nothing rewards show two bars)."""
    figure, axis = plt.subplots(figsize=(6, 3), dpi=100)
    axis.hist(rewards, bins=20, range=(min([0.0, *rewards]), max([1.0, *rewards])), color="tab:blue")
    axis.set(xlabel="reward", ylabel="samples", title=title)
    axis.grid(alpha=0.3)
    return _png(figure)


def difficulty_curve_png(rows: list[dict]) -> bytes:
    """Train pass rate per iteration, one line per experiment and difficulty."""
    figure, axis = plt.subplots(figsize=(7, 4), dpi=100)
    order = {"easy": 0, "medium": 1, "hard": 2}
    lines = {(row["experiment"], row["difficulty"]) for row in rows}
    for experiment, difficulty in sorted(lines, key=lambda line: (line[0], order.get(line[1], 3), line[1])):
        points = [row for row in rows if (row["experiment"], row["difficulty"]) == (experiment, difficulty)]
        axis.plot([row["iteration"] for row in points], [row["pass_rate"] for row in points], marker="o",
                  label=f"{experiment}: {difficulty}")
    axis.set(xlabel="iteration", ylabel="train pass rate", ylim=(0, 1), title="Pass rate by difficulty")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    return _png(figure)


def markdown_table(rows: list[dict], columns: tuple[str, ...]) -> str:
    def cell(value) -> str:
        return f"{value:.3f}" if isinstance(value, float) else ("" if value is None else str(value))

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def png_markdown(title: str, png: bytes) -> str:
    """An inline image the Dagster UI renders in Markdown metadata."""
    return f"![{title}](data:image/png;base64,{base64.b64encode(png).decode()})"


def eval_curve_png(experiment: str, points: list[tuple[int, float, float]],
                   blanked: list[tuple[int, float, float]] = ()) -> bytes:
    """Held-out pass rate (± one standard error) per iteration; iteration 0 is the base policy.
    `blanked`: the same checkpoints with their observations hidden, beside it."""
    figure, axis = plt.subplots(figsize=(6, 3.5), dpi=100)
    axis.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points],
                  marker="o", capsize=3, label=experiment)
    if blanked:
        axis.errorbar([p[0] for p in blanked], [p[1] for p in blanked], yerr=[p[2] for p in blanked],
                      marker="s", capsize=3, color="tab:orange", label="observations blanked")
    axis.axhline(points[0][1], color="grey", linestyle=":", label="base policy")
    axis.set(xlabel="iteration (0 = base policy)", ylabel="held-out pass rate", ylim=(0, 1),
             title=f"{experiment}: held-out pass rate ± 1 s.e.")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return _png(figure)


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()
