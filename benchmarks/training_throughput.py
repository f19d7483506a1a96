"""Training throughput of one GRPO step on the default model, side by side with TRL's GRPO loss.

    .venv/bin/pip install --no-deps --target .venv-trl -r benchmarks/requirements-trl.txt   # once
    .venv/bin/python benchmarks/training_throughput.py [--prompts 16] [--group 4] [--steps 4] [--rounds 3]

The same model (the default 3.43M Llama, built from its config), the same batch (train prompts of
the compose set, the default experiment's, with their reference solutions as completions,
behaviour log-probs from teacher forcing, rewards with a spread in every group), the same
micro-batches of 16, 2 threads; each optimizer step is forward + backward on every
micro-batch, gradient clipping and AdamW:
  crucible   training/rl/trainer.py's step loop (train_policy; the loop is timed, not load and save)
  trl        TRL's GRPOTrainer._compute_loss (loss_type "bnpo": token-level, like ours) on inputs
             laid out as TRL lays them (left-padded prompts, right-padded completions)
Throughput counts real tokens (prompt + completion, no padding) per second, so that neither
layout is credited for its padding. Rounds alternate between the two to share the machine's noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from task_sets.loader import load_task_set
from training.agent.prompts import render_prompt
from training.policy.batching import make_batch, token_logprobs
from training.policy.chat import ChatFormat
from training.policy.model import build_base_policy, load_policy
from training.rl.trainer import GRPOConfig, TrainSample, train_policy

TRL_DIR = Path(__file__).resolve().parent.parent / ".venv-trl"
MICRO_BATCH = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(TRL_DIR))
    try:
        import trl  # noqa: F401  (only to fail early with the install line)
    except ImportError:
        sys.exit(f"TRL is not installed beside the project: .venv/bin/pip install --no-deps --target {TRL_DIR} "
                 "-r benchmarks/requirements-trl.txt")
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as scratch:
        policy = build_base_policy(Path(scratch) / "policy")
        samples = batch(policy, args.prompts, args.group)
        real_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples) * args.steps
        results: dict[str, list[float]] = {"crucible": [], "trl": []}
        for round_ in range(args.rounds):
            results["crucible"].append(crucible_seconds(policy, samples, args.steps, Path(scratch) / f"out{round_}"))
            results["trl"].append(trl_seconds(policy, samples, args.steps, Path(scratch) / "trl"))
    report(results, real_tokens, args)


def batch(policy: Path, prompts: int, group: int) -> list[TrainSample]:
    model, tokenizer = load_policy(policy)
    chat = ChatFormat.of(tokenizer, model.generation_config)
    tasks = load_task_set("compose").train()[:prompts]
    samples = []
    for task in tasks:
        prompt = render_prompt(chat, task.prompt)
        response = chat.reply_ids(task.reference_solution)
        with torch.no_grad():
            tokens = make_batch([prompt], [response], chat.pad_id)
            logprobs = token_logprobs(model, tokens)[0, tokens.response_slices[0]].tolist()
        samples += [TrainSample(prompt, response, logprobs, float(i % 2), task.id) for i in range(group)]
    return samples


def crucible_seconds(policy: Path, samples: list[TrainSample], steps: int, out: Path) -> float:
    config = GRPOConfig(lr=1e-4, lr_warmup_steps=0, epochs=steps, minibatch_size=len(samples),  # as TRL's below
                        micro_batch_size=MICRO_BATCH, keep_optimizer_state=False, threads=2)
    return train_policy(policy, samples, out, config)["seconds"]


def trl_inputs(samples: list[TrainSample], advantages: torch.Tensor, pad_id: int) -> dict[str, torch.Tensor]:
    prompt_width = max(len(s.prompt_ids) for s in samples)
    completion_width = max(len(s.response_ids) for s in samples)
    prompt_ids = torch.full((len(samples), prompt_width), pad_id)
    prompt_mask = torch.zeros((len(samples), prompt_width), dtype=torch.long)
    completion_ids = torch.full((len(samples), completion_width), pad_id)
    completion_mask = torch.zeros((len(samples), completion_width), dtype=torch.long)
    old = torch.zeros((len(samples), completion_width))
    for row, s in enumerate(samples):
        prompt_ids[row, prompt_width - len(s.prompt_ids):] = torch.tensor(s.prompt_ids)
        prompt_mask[row, prompt_width - len(s.prompt_ids):] = 1
        completion_ids[row, : len(s.response_ids)] = torch.tensor(s.response_ids)
        completion_mask[row, : len(s.response_ids)] = 1
        old[row, : len(s.response_ids)] = torch.tensor(s.behaviour_logprobs)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "advantages": advantages, "old_per_token_logps": old}


def trl_seconds(policy: Path, samples: list[TrainSample], steps: int, out: Path) -> float:
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    model, tokenizer = load_policy(policy)
    model.train()
    config = TRLConfig(output_dir=str(out), loss_type="bnpo", beta=0.0, use_cpu=True, report_to=[],
                       per_device_train_batch_size=len(samples), num_generations=4, max_completion_length=256,
                       gradient_accumulation_steps=1, logging_steps=10**9, save_strategy="no",
                       gradient_checkpointing=False)  # TRL turns it on by default; ours recomputes nothing
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=config,
                          train_dataset=Dataset.from_dict({"prompt": ["x"] * 4}), processing_class=tokenizer)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.training_step, which is not used here
    rewards = torch.tensor([s.reward for s in samples]).view(-1, 4)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).flatten()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0)
    micro = [samples[i : i + MICRO_BATCH] for i in range(0, len(samples), MICRO_BATCH)]
    inputs = [trl_inputs(chunk, advantages[i * MICRO_BATCH : (i + 1) * MICRO_BATCH], tokenizer.pad_token_id)
              for i, chunk in enumerate(micro)]
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        for chunk in inputs:
            (trainer._compute_loss(model, chunk) / len(inputs)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return time.perf_counter() - start


def report(results: dict[str, list[float]], real_tokens: int, args) -> None:
    table = Table(title=f"one GRPO step: {args.prompts} prompts x {args.group} completions, {args.steps} optimizer "
                        f"steps, micro-batches of {MICRO_BATCH}, 2 threads (median of {args.rounds} rounds)")
    for column in ("implementation", "seconds", "real tokens/s", "vs TRL"):
        table.add_column(column, justify="right")
    trl_median = statistics.median(results["trl"])
    for name, seconds in results.items():
        median = statistics.median(seconds)
        table.add_row(name, f"{median:.2f}", f"{real_tokens / median:,.0f}", f"{trl_median / median:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
