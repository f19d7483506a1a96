"""Generation and episode throughput on the default CPU model, side by side in one run.

    .venv/bin/python benchmarks/rollout_throughput.py [--prompts 16] [--new-tokens 64] [--episodes 8] [--turns 3]

Part 1, what the engine interface costs over the model's own `generate` (same prompts, same
sampling, same seed, one thread unless said):
  raw                     model.generate, left-padded batch, no scores
  raw + scores            the same with output_scores (what log-probs need)
  engine                  TransformersEngine: batching by length, log-probs, stop handling, Completions
  engine, N threads       the same with a thread per CPU the process may use (the engine's default:
                          an episode's generation and its actions take turns, so it has the cores)
Part 2, episodes per minute (a default-model policy whose every reply runs a real command in its
sandbox session: generation is the model's, the action is fixed so every turn does sandbox work):
  sequential              one episode at a time, turn by turn
  batched + concurrent    run_episodes: one batched generation per turn for every live episode,
                          then their commands run concurrently in their own sessions
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from sandbox.backends import open_sandbox
from task_sets.loader import load_task_set
from task_sets.submission import sandbox_spec
from training.agent.episodes import EpisodeLimits, run_episodes, starting_files
from training.agent.prompts import render_prompt
from training.inference.engine import Completion, SamplingParams
from training.inference.transformers_engine import TransformersEngine
from training.policy.model import build_base_policy

ACTION = "<run>python3 -c 'print(sum(range(10**5)))'</run>"


class ModelThenFixedAction:
    """The default model generates each reply for real; the reply it is credited with is ACTION,
    so that every turn also does sandbox work. Both costs are real; only the text is fixed."""

    def __init__(self, engine: TransformersEngine):
        self.engine, self.policy_version, self.chat = engine, engine.policy_version, engine.chat
        self.action_ids = engine.chat.reply_ids(ACTION)

    def generate(self, prompts, params, conversations=None):
        groups = self.engine.generate(prompts, params)
        text = self.chat.tokenizer.decode(self.action_ids)
        return [[Completion(self.action_ids, [0.0] * len(self.action_ids), "stop", text) for _ in g] for g in groups]


def generation_rows(engine: TransformersEngine, prompts: list[list[int]], params: SamplingParams, runs: int,
                    cores: int):
    prompts = sorted(prompts, key=len)  # the engine's own batch order, so every row draws the same samples
    config = engine._generation_config(params)
    bare = config.to_dict() | {"output_scores": False, "return_dict_in_generate": False}
    width = max(map(len, prompts))
    ids = torch.tensor([[engine.pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    generated = {}

    def raw(name, generation_config) -> None:
        with torch.inference_mode():
            torch.manual_seed(params.seed)
            out = engine.model.generate(input_ids=ids, attention_mask=mask, generation_config=generation_config)
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        generated[name] = _until_stop(sequences[:, width:].tolist(), engine.stop_ids)

    def through_engine(name: str = "engine", threads: int = 1) -> None:
        torch.set_num_threads(threads)
        groups = engine.generate(prompts, single)
        torch.set_num_threads(1)
        generated[name] = sum(len(group[0].token_ids) for group in groups)

    single = SamplingParams(n=1, max_new_tokens=params.max_new_tokens, temperature=params.temperature,
                            seed=params.seed)
    cases = {
        "raw": lambda: raw("raw", type(config).from_dict(bare)),
        "raw + scores": lambda: raw("raw + scores", config),
        "engine": through_engine,
        f"engine, {cores} threads": lambda: through_engine(f"engine, {cores} threads", cores),
    }
    for call in cases.values():
        call()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):  # interleaved, so machine noise hits every path alike
        for name, call in cases.items():
            times[name].append(_timed(call))
    return {name: statistics.median(values) for name, values in times.items()}, generated


def _until_stop(rows: list[list[int]], stop_ids: list[int]) -> int:
    """Tokens generated per row up to and including the first stop token, summed."""
    return sum(next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row)) for row in rows)


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def episode_rows(engine: TransformersEngine, tasks, params: SamplingParams, limits: EpisodeLimits):
    policy = ModelThenFixedAction(engine)

    def open_session(task):
        return open_sandbox("local", sandbox_spec(task)).session(starting_files(task))

    one = SamplingParams(n=1, max_new_tokens=params.max_new_tokens, temperature=params.temperature, seed=params.seed)
    started = time.perf_counter()
    for task in tasks:
        run_episodes(policy, engine.chat, [task], one, limits, open_session, "bench")
    sequential = time.perf_counter() - started
    started = time.perf_counter()
    run_episodes(policy, engine.chat, tasks, one, limits, open_session, "bench")
    together = time.perf_counter() - started
    return sequential, together


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    console = Console()
    cores = len(os.sched_getaffinity(0))  # what the engine takes by default
    tasks = load_task_set("default").train()
    with tempfile.TemporaryDirectory() as scratch:
        policy = build_base_policy(Path(scratch) / "policy")  # the default model's architecture and size
        engine = TransformersEngine(policy, "bench", threads=1, batch_size=64, static_cache=True)
        params = SamplingParams(n=1, max_new_tokens=args.new_tokens, temperature=1.0, seed=0)
        prompts = [render_prompt(engine.chat, task.prompt) for task in tasks[: args.prompts]]
        console.print(f"generation: {len(prompts)} prompts x {args.new_tokens} new tokens, {args.runs} runs each …")
        medians, generated = generation_rows(engine, prompts, params, args.runs, cores)
        table = Table(title=f"Generation, default model: {len(prompts)} prompts x {args.new_tokens} new tokens, "
                            f"1 thread unless said, median of {args.runs}")
        for column in ("path", "seconds", "tokens", "tokens/s", "vs raw + scores"):
            table.add_column(column, justify="left" if column == "path" else "right")
        for name, seconds in medians.items():
            table.add_row(name, f"{seconds:.2f}", str(generated[name]), f"{generated[name] / seconds:.0f}",
                          f"{seconds / medians['raw + scores'] - 1:+.1%}")
        console.print(table)

        limits = EpisodeLimits(max_turns=args.turns, max_tokens=1024)
        console.print(f"episodes: {args.episodes} episodes x {args.turns} turns, sequential then together …")
        sequential, together = episode_rows(engine, tasks[: args.episodes], params, limits)
    table = Table(title=f"Episodes, default model: {args.episodes} episodes x {args.turns} turns, "
                        f"{args.new_tokens} new tokens and a real command a turn")
    for column in ("schedule", "seconds", "episodes/min", "vs sequential"):
        table.add_column(column, justify="left" if column == "schedule" else "right")
    for name, seconds in (("sequential", sequential), ("batched + concurrent", together)):
        table.add_row(name, f"{seconds:.1f}", f"{60 * args.episodes / seconds:.1f}", f"{sequential / seconds:.2f}x")
    console.print(table)


if __name__ == "__main__":
    main()
