"""Shared-prefix training against whole rows: one GRPO step on a stored iteration's episodes,
the same samples, the same parent checkpoint and settings, `grpo.share_prefixes` on and off.

    .venv/bin/crucible run --config experiments/repair.toml --iterations 1   # episodes to train on
    .venv/bin/python benchmarks/shared_prefix_training.py [--experiment repair] [--iteration 1] \
        [--groups 32] [--rounds 2] [--storage .crucible/data] [--checkpoints .crucible/checkpoints]

The samples are the ones the iteration's `checkpoint` step trained on (`train_samples` of its
trajectories partition), cut to the first `--groups` prompts; the parent is the checkpoint that
sampled them, the settings the experiment's stored `grpo` section. Rounds alternate the two
variants; each is timed by train_policy's `seconds` (the optimizer steps, not loading or saving).
Positions are what went through the decoder (padded; a shared prefix once). The two must agree
to rounding on the loss, the gradient norm and the weights they write; the table says how far
apart they landed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

VARIANTS = {"whole rows": False, "shared prefixes": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", default="repair")
    parser.add_argument("--iteration", type=int, default=1, help="whose episodes to train on (>= 1)")
    parser.add_argument("--groups", type=int, default=32, help="prompts to keep, with all their episodes")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--storage", default=".crucible/data")
    parser.add_argument("--checkpoints", default=".crucible/checkpoints")
    args = parser.parse_args()

    from transformers.utils import logging as transformers_logging

    from assets.resources import CrucibleResource

    transformers_logging.disable_progress_bar()  # loading and saving checkpoints, every run

    resource = CrucibleResource(storage_root=args.storage, checkpoint_root=args.checkpoints)
    settings = resource.experiment(args.experiment)
    samples = first_groups(stored_samples(args.storage, args.experiment, args.iteration), args.groups)
    parent = resource.checkpoint_dir(args.experiment, args.iteration - 1)
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for name, share in VARIANTS.items():
                grpo = settings.grpo.model_copy(update={"share_prefixes": share})
                out = Path(scratch) / f"{share}-{round_}"
                runs[name].append(train(parent, samples, out, grpo, settings.temperature))
                print(f"round {round_ + 1}/{args.rounds}, {name}: {runs[name][-1]['seconds']:.1f} s", flush=True)
        gap = weight_difference(Path(scratch) / "False-0", Path(scratch) / "True-0")
    report(runs, gap, len(samples), args)


def stored_samples(storage: str, experiment: str, iteration: int) -> list:
    from datastore.store import DatasetStore
    from training.rl.step import train_samples

    return train_samples(DatasetStore(storage).read_partition("trajectories", experiment, iteration))


def first_groups(samples: list, groups: int) -> list:
    """Every sample of the first `groups` prompts (group ids in the order they first appear)."""
    kept = set(list(dict.fromkeys(s.group_id for s in samples))[:groups])
    return [s for s in samples if s.group_id in kept]


def train(parent: Path, samples: list, out: Path, grpo, temperature: float) -> dict:
    from training.rl.trainer import train_policy

    return train_policy(parent, samples, out, grpo, temperature=temperature)


def weight_difference(a: Path, b: Path) -> float:
    """The largest absolute difference over every weight."""
    from training.policy.model import load_policy

    first, second = load_policy(a)[0].state_dict(), load_policy(b)[0].state_dict()
    return max(float((first[name] - second[name]).abs().max()) for name in first)


def report(runs: dict[str, list[dict]], weight_gap: float, samples: int, args) -> None:
    table = Table(title=f"one GRPO step on {args.experiment} iteration {args.iteration}'s episodes: {samples} "
                        f"samples of {args.groups} prompts (median of {args.rounds} alternating rounds)")
    for column in ("variant", "seconds", "positions", "positions/s", "vs whole rows", "loss", "grad norm",
                   "final kl"):
        table.add_column(column, justify="right")
    baseline = statistics.median(run["seconds"] for run in runs["whole rows"])
    for name, metrics in runs.items():
        seconds, first = statistics.median(run["seconds"] for run in metrics), metrics[0]
        table.add_row(name, f"{seconds:.1f}", f"{first['tokens']:,}", f"{first['tokens'] / seconds:,.0f}",
                      f"{baseline / seconds:.2f}x", f"{first['loss']:.6f}", f"{first['grad_norm']:.6f}",
                      f"{first['final_kl']:.2e}")
    Console(width=150).print(table)
    print(f"largest |weight difference| between the two checkpoints of round 1: {weight_gap:.1e} "
          f"(lr {runs['whole rows'][0]['lr']:g}: Adam moves a weight by up to ~lr a step)")


if __name__ == "__main__":
    main()
