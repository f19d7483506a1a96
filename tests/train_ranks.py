"""One training step (or a warm-up) under torchrun, for the data-parallel tests: every rank
builds the same samples (a pure function of the seed) and calls train_policy (supervised_warmup)
inside the process group.

    torchrun --nproc-per-node N tests/train_ranks.py POLICY OUT SETTINGS_JSON [grpo|sft]
"""

from __future__ import annotations

import json
import random
import sys

from training.optim.distributed import process_group
from training.rl.settings import GRPOConfig
from training.rl.trainer import TrainSample, train_policy
from training.sft.job import Example
from training.sft.settings import SFTConfig
from training.sft.warmup import supervised_warmup


def samples(count: int = 24, seed: int = 0) -> list[TrainSample]:
    """Groups of 4 of uneven lengths (so micro-batches and rank shares differ), rewards with a
    spread; a group's samples share their prompt (which the step runs once)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        if i % 4 == 0:
            prompt = [rng.randrange(3, 200) for _ in range(rng.randrange(8, 16))]
        response = [rng.randrange(3, 200) for _ in range(rng.randrange(2, 20))]
        out.append(TrainSample(prompt, response, [-3.0] * len(response), float(rng.random() < 0.5), f"g{i // 4}"))
    return out


def examples() -> list[Example]:
    """The samples as demonstrations, every fourth with a reply it does not learn whole."""
    return [Example(s.prompt_ids, s.response_ids, [k % 2 for k in range(len(s.response_ids))] if i % 4 == 3 else None)
            for i, s in enumerate(samples())]


def main() -> None:
    policy, out, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    kind = sys.argv[4] if len(sys.argv) > 4 else "grpo"
    with process_group() as ranks:
        if kind == "sft":
            metrics = supervised_warmup(policy, examples(), out, SFTConfig(**settings))
        else:
            metrics = train_policy(policy, samples(), out, GRPOConfig(**settings))
    if ranks.writes:  # one line on torchrun's shared stdout: two ranks' lines can interleave
        print(json.dumps({key: value for key, value in metrics.items() if isinstance(value, (int, float))}))


if __name__ == "__main__":
    main()
