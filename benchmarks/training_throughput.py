"""Training throughput of one GRPO step on the CPU: one process against two data parallel
ranks under torchrun (DDP and FSDP2), the same global batch, and how far their weights land apart.

    .venv/bin/python benchmarks/training_throughput.py [--prompts 32] [--group 4] [--epochs 2] [--rounds 2]

The same model (the default 3.43M Llama, built from its config), the same batch (train prompts of
the compose set, the default experiment's, with their reference solutions as completions,
behaviour log-probs from teacher forcing, rewards with a spread in every group), the same
token-sized micro-batches, the machine's threads shared out (1 rank x 2 threads, 2 ranks x 1):
  1 rank       train_policy in one process (what the step runs without torchrun)
  2 ranks ddp  torchrun --standalone --nproc-per-node 2, DistributedDataParallel over gloo
  2 ranks fsdp the same with FSDP2's fully_shard (parameters, gradients and optimizer state sharded)
Throughput counts real tokens (prompt + completion, no padding) of every optimizer step; the time
is the step loop's (train_policy's `seconds`: not loading or saving). Rounds alternate. The
weight difference after the first step is 0: Adam's first update is lr x sign(gradient); from
the second on, weights whose gradient is at rounding level may differ by up to a step (lr).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {"1 rank": (1, "ddp"), "2 ranks ddp": (2, "ddp"), "2 ranks fsdp": (2, "fsdp")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2, help="passes over the batch, one optimizer step each")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker", nargs=4, metavar=("POLICY", "SAMPLES", "OUT", "PARALLEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, epochs=args.epochs)
        return
    with tempfile.TemporaryDirectory() as scratch:
        from training.policy.model import build_base_policy

        policy = build_base_policy(Path(scratch) / "policy")
        samples = batch(policy, args.prompts, args.group)
        (Path(scratch) / "samples.pkl").write_bytes(pickle.dumps(samples))
        real_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples) * args.epochs
        seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for round_ in range(args.rounds):
            for name, (ranks, parallel) in VARIANTS.items():
                out = Path(scratch) / f"{_slug(name)}-{round_}"
                seconds[name].append(run(ranks, parallel, policy, Path(scratch) / "samples.pkl", out, args.epochs))
        differences = {name: weight_difference(Path(scratch) / "1-rank-0", Path(scratch) / f"{_slug(name)}-0")
                       for name in VARIANTS}
    report(seconds, differences, real_tokens, args)


def _slug(variant: str) -> str:
    return variant.replace(" ", "-")


def batch(policy: Path, prompts: int, group: int):
    from task_sets.loader import load_task_set
    from training.agent.prompts import render_prompt
    from training.policy.batching import make_batch, token_logprobs
    from training.policy.chat import ChatFormat
    from training.policy.model import load_policy
    from training.rl.trainer import TrainSample

    model, tokenizer = load_policy(policy)
    chat = ChatFormat.of(tokenizer, model.generation_config)
    samples = []
    for task in load_task_set("compose").train()[:prompts]:
        prompt = render_prompt(chat, task.prompt)
        response = chat.reply_ids(task.reference_solution)
        with torch.no_grad():
            tokens = make_batch([prompt], [response], chat.pad_id)
            logprobs = token_logprobs(model, tokens)[0, tokens.response_slices[0]].tolist()
        samples += [TrainSample(prompt, response, logprobs, float(i % 2), task.id) for i in range(group)]
    return samples


def run(ranks: int, parallel: str, policy: Path, samples: Path, out: Path, epochs: int) -> float:
    worker_args = [__file__, "--epochs", str(epochs), "--worker", str(policy), str(samples), str(out), parallel]
    launcher = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                      "--nproc-per-node", str(ranks)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(2 // ranks)}
    done = subprocess.run([*launcher, *worker_args], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def worker(policy: str, samples: str, out: str, parallel: str, epochs: int) -> None:
    from training.optim.distributed import process_group
    from training.rl.settings import GRPOConfig
    from training.rl.trainer import train_policy

    batch = pickle.loads(Path(samples).read_bytes())
    config = GRPOConfig(lr=1e-4, lr_warmup_steps=0, epochs=epochs, minibatch_size=len(batch),
                        keep_optimizer_state=False, threads=2, parallel=parallel)
    with process_group() as ranks:
        metrics = train_policy(policy, batch, out, config)
    if ranks.writes:
        print(json.dumps({"seconds": metrics["seconds"]}))


def weight_difference(a: Path, b: Path) -> tuple[float, float]:
    """The largest and the mean absolute difference over every weight."""
    from training.policy.model import load_policy

    first, second = load_policy(a)[0].state_dict(), load_policy(b)[0].state_dict()
    gaps = torch.cat([(first[name] - second[name]).abs().flatten() for name in first])
    return float(gaps.max()), float(gaps.mean())


def report(seconds: dict[str, list[float]], differences: dict[str, tuple[float, float]], real_tokens: int,
           args) -> None:
    table = Table(title=f"one GRPO step: {args.prompts} prompts x {args.group} completions, {args.epochs} optimizer "
                        f"steps, 2 CPU threads in all (median of {args.rounds} alternating rounds)")
    for column in ("variant", "seconds", "real tokens/s", "vs 1 rank", "|weight - 1 rank's| max", "mean"):
        table.add_column(column, justify="right")
    single = statistics.median(seconds["1 rank"])
    for name, runs in seconds.items():
        median = statistics.median(runs)
        table.add_row(name, f"{median:.2f}", f"{real_tokens / median:,.0f}", f"{single / median:.2f}x",
                      f"{differences[name][0]:.1e}", f"{differences[name][1]:.1e}")
    Console().print(table)


if __name__ == "__main__":
    main()
