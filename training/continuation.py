"""When continuous training of an experiment stops: the rules the advance_iterations sensor follows."""

from __future__ import annotations

from training.experiment import ExperimentConfig


def reason_to_stop(experiment: ExperimentConfig, last: int, blocked: bool,
                   held_out: list[tuple[int, float]]) -> str | None:
    """Why a continuously trained experiment gets no iteration after `last` (its latest evaluated
    one), or None to go on. `blocked`: checkpoint `last` failed a blocking stability check; `held_out`: (iteration,
    pass rate) of its evaluations, the base policy's (iteration 0) included."""
    if last >= experiment.iterations:
        return f"reached its limit of {experiment.iterations} iterations"
    if blocked:
        return f"checkpoint {last} failed a blocking stability check"
    patience = experiment.plateau_patience
    scored = [(iteration, rate) for iteration, rate in held_out if iteration <= last]
    if patience and scored:
        best_iteration, best = max(scored, key=lambda point: (point[1], -point[0]))
        if last - best_iteration >= patience:
            return (f"plateau: the held-out pass rate has not beaten {best:.3f} (iteration {best_iteration}) "
                    f"for {last - best_iteration} iterations (plateau_patience {patience})")
    return None
