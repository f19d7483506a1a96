"""Reference (and truncated-IS) log-probs of a training step's samples: one forward pass per
sample, as the trainer took them before, against the trainer's micro-batches.

    .venv/bin/python benchmarks/reference_logprobs.py [--prompts 32] [--group 8] [--rounds 3]

The default 3.43M model built from its config, train prompts of the compose set with their
reference solutions as completions (the default experiment's batch is 64 x 8), 2 threads, no
gradients:
  per-sample   make_batch + token_logprobs on one sample at a time (the bare baseline)
  batched      training/rl/forward.py's Forward.logprobs: the trainer's micro-batches (4,096 padded
               tokens, of similar lengths)
Both must give the same log-probs (the table shows the largest difference). Rounds alternate
between the two to share the machine's noise; the table shows the median.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from task_sets.loader import load_task_set
from training.agent.prompts import render_prompt
from training.optim.scorer import TokenScorer
from training.policy.batching import make_batch, token_logprobs
from training.policy.chat import ChatFormat
from training.policy.model import build_base_policy, load_policy
from training.rl.forward import Forward
from training.rl.settings import GRPOConfig
from training.rl.trainer import TrainSample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as scratch:
        model, tokenizer = load_policy(build_base_policy(Path(scratch) / "policy"))
    model.eval()
    chat = ChatFormat.of(tokenizer, model.generation_config)
    samples = batch(chat, args.prompts, args.group)
    defaults = GRPOConfig()
    forward = Forward(chat.pad_id, defaults.micro_batch_tokens, temperature=0.6)
    scorer = TokenScorer(model, defaults.logprob_chunk_tokens)
    seconds: dict[str, list[float]] = {"per-sample": [], "batched": []}
    for _ in range(args.rounds):
        started = time.perf_counter()
        one_by_one = per_sample(model, samples, chat.pad_id, forward.temperature)
        seconds["per-sample"].append(time.perf_counter() - started)
        started = time.perf_counter()
        batched = forward.logprobs(scorer, samples)
        seconds["batched"].append(time.perf_counter() - started)
    difference = max(abs(a - b) for x, y in zip(one_by_one, batched) for a, b in zip(x, y))
    report(seconds, len(samples), difference)


def batch(chat: ChatFormat, prompts: int, group: int) -> list[TrainSample]:
    tasks = load_task_set("compose").train()[:prompts]
    samples = []
    for task in tasks:
        prompt = render_prompt(chat, task.prompt)
        response = chat.reply_ids(task.reference_solution)
        samples += [TrainSample(prompt, response, [0.0] * len(response), float(i % 2), task.id) for i in range(group)]
    return samples


def per_sample(model, samples: list[TrainSample], pad_id: int, temperature: float) -> list[list[float]]:
    out = []
    with torch.no_grad():
        for s in samples:
            tokens = make_batch([s.prompt_ids], [s.response_ids], pad_id)
            out.append(token_logprobs(model, tokens, temperature)[0, tokens.response_slices[0]].tolist())
    return out


def report(seconds: dict[str, list[float]], samples: int, difference: float) -> None:
    table = Table(title=f"log-probs of {samples} samples, no gradients (median of {len(seconds['batched'])} rounds)")
    for header in ("way", "seconds", "samples/s", "speed-up", "largest |difference|"):
        table.add_column(header, justify="right")
    baseline = statistics.median(seconds["per-sample"])
    for way, values in seconds.items():
        median = statistics.median(values)
        table.add_row(way, f"{median:.2f}", f"{samples / median:.0f}", f"{baseline / median:.1f}x",
                      "" if way == "per-sample" else f"{difference:.1e}")
    Console().print(table)


if __name__ == "__main__":
    main()
