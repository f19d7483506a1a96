"""Plots and tables for asset metadata and the documentation: PNG bytes and Markdown."""

from __future__ import annotations

import base64
import io
import math

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
    return figure_png(figure)


def reward_histogram_png(rewards: list[float], title: str) -> bytes:
    """How the scored samples' rewards are spread (all-or-nothing rewards show two bars)."""
    figure, axis = plt.subplots(figsize=(6, 3), dpi=100)
    axis.hist(rewards, bins=20, range=(min([0.0, *rewards]), max([1.0, *rewards])), color="tab:blue")
    axis.set(xlabel="reward", ylabel="samples", title=title)
    axis.grid(alpha=0.3)
    return figure_png(figure)


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
    return figure_png(figure)


def significant(value: float, digits: int = 3) -> float:
    """`value` rounded to `digits` significant digits, for reading (a learning rate of 3e-4 and a
    KL of 4.5e-4 keep their digits; 0.123456 reads 0.123). Infinities and NaN pass through."""
    return value if not math.isfinite(value) else float(f"{value:.{digits}g}")


def markdown_table(rows: list[dict], columns: tuple[str, ...]) -> str:
    def cell(value) -> str:
        return f"{significant(value):g}" if isinstance(value, float) else ("" if value is None else str(value))

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
    return figure_png(figure)


STAGES = {"rollouts": "sampling", "verified_rollouts": "grading", "trajectories": "storing",
          "parent_checkpoint": "waiting for the parent", "checkpoint": "training", "checkpoint_eval": "evaluation"}
TRAINING_PANELS = ("held-out pass rate ± 1 s.e.", "train pass rate", "KL to the sampling policy", "entropy (nats)",
                   "sampled tokens per sample", "seconds per stage")


def training_figure(experiment: str, rows: list[dict]):
    """How training went, one panel per measure (TRAINING_PANELS), from the iterations view's
    rows of one experiment (iteration 0: the base policy's evaluation)."""
    figure, axes = plt.subplots(2, 3, figsize=(13, 6.5), dpi=90)
    panels = dict(zip(TRAINING_PANELS, axes.flat))
    trained = [row for row in rows if row["iteration"] > 0]
    evaluated = [row for row in rows if row["eval_pass_rate"] is not None]
    blanked = [row for row in evaluated if row["eval_blanked_pass_rate"] is not None]
    held_out = panels["held-out pass rate ± 1 s.e."]
    held_out.errorbar(_x(evaluated), _y(evaluated, "eval_pass_rate"), yerr=_y(evaluated, "eval_stderr"),
                      marker="o", capsize=3, label="observations shown")
    if blanked:
        held_out.errorbar(_x(blanked), _y(blanked, "eval_blanked_pass_rate"), yerr=_y(blanked, "eval_blanked_stderr"),
                          marker="s", capsize=3, color="tab:orange", label="blanked")
    held_out.legend(fontsize=7)
    panels["train pass rate"].plot(_x(trained), _y(trained, "pass_rate"), marker="o")
    kl = panels["KL to the sampling policy"]
    kl.plot(_x(trained), _y(trained, "mean_step_kl"), marker="o", label="mean over the steps")
    kl.plot(_x(trained), _y(trained, "final_kl"), marker="s", label="after the last step")
    kl.legend(fontsize=7)
    panels["entropy (nats)"].plot(_x(trained), _y(trained, "entropy"), marker="o")
    panels["sampled tokens per sample"].plot(_x(trained), _y(trained, "sampled_tokens"), marker="o")
    stages, bottom = panels["seconds per stage"], [0.0] * len(trained)
    for column, label in STAGES.items():
        seconds = [row.get(column) or 0.0 for row in trained]
        stages.bar(_x(trained), seconds, bottom=bottom, label=label)
        bottom = [b + s for b, s in zip(bottom, seconds)]
    stages.legend(fontsize=7)
    for title, axis in panels.items():
        axis.set(title=title, xlabel="iteration")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
    for axis in (held_out, panels["train pass rate"]):
        axis.set_ylim(0, 1)
    for axis in panels.values():  # one iteration axis for all, the base policy's 0 included
        axis.set_xlim(-0.5, max(_x(rows), default=0) + 0.5)
    figure.suptitle(f"{experiment}: how training goes")
    figure.tight_layout()
    return figure


def _x(rows: list[dict]) -> list[int]:
    return [row["iteration"] for row in rows]


def _y(rows: list[dict], column: str) -> list[float]:
    return [math.nan if row[column] is None else row[column] for row in rows]


def figure_png(figure) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()
