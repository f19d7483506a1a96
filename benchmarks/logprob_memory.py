"""Peak memory and speed of the trainer's log-prob computation with a 152k vocabulary: the
full-vocabulary path the trainer used before against the chunked one, same model, same batch.

    .venv/bin/python benchmarks/logprob_memory.py [--rows 8] [--length 512] [--rounds 2]

The model is a random-weight Qwen2 with Qwen2.5's vocabulary size (151,936, tied embeddings),
small elsewhere (hidden 256, 2 layers) so that the LM head is what the measurement sees; the
batch is `rows` sequences of `length` random token ids, the second half of each a response.
One measurement is forward + GRPO loss + backward of that batch as one micro-batch, float32:
  full-vocabulary  model(...).logits in float32 for every position, log_softmax, entropy, gather
                   (training/policy/batching.py before the chunked head; the bare baseline)
  chunked          token_logprobs_and_entropy: the response positions only, 512 rows per LM-head
                   call, each chunk's logits recomputed in the backward pass
Each measurement runs in a fresh process; peak memory is the growth of its resident set's high
water mark (VmHWM, reset through /proc/self/clear_refs) over the resident set before the
forward pass: the model and its weights are not counted, the activations, logits and gradients
are. Rounds alternate between the two to share the machine's noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

QWEN_VOCABULARY = 151_936
PATHS = ("full-vocabulary", "chunked")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--measure", choices=PATHS, help=argparse.SUPPRESS)  # one measurement, in this process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.rows, args.length)))
        return
    results: dict[str, list[dict]] = {path: [] for path in PATHS}
    for _ in range(args.rounds):
        for path in PATHS:
            command = [sys.executable, __file__, "--measure", path, "--rows", str(args.rows),
                       "--length", str(args.length)]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            results[path].append(json.loads(done.stdout.strip().splitlines()[-1]))
    report(results, args)


def model_and_batch(rows: int, length: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from training.policy.batching import make_batch

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=QWEN_VOCABULARY, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    ids = torch.randint(3, QWEN_VOCABULARY, (rows, length)).tolist()
    half = length // 2
    return model, make_batch([row[:half] for row in ids], [row[half:] for row in ids], pad_id=0)


def full_vocabulary_logprobs(model, batch, temperature: float):
    """The trainer's log-probs before the chunked head: every position's logits in float32."""
    logits = model(input_ids=batch.input_ids).logits.float() / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    with torch.no_grad():
        entropy = -(logprobs.exp() * logprobs).sum(dim=-1)
    return logprobs.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1), entropy


def measure(path: str, rows: int, length: int) -> dict:
    from training.policy.batching import token_logprobs_and_entropy
    from training.rl.grpo import clipped_policy_loss

    torch.set_num_threads(2)
    model, batch = model_and_batch(rows, length)
    score = full_vocabulary_logprobs if path == "full-vocabulary" else token_logprobs_and_entropy
    behaviour = torch.full_like(batch.mask, -12.0)
    advantages = torch.linspace(-1, 1, rows)
    before = _resident_kb()
    _reset_peak()
    start = time.perf_counter()
    logprobs, _ = score(model, batch, 0.7)
    loss, _ = clipped_policy_loss(logprobs, behaviour, advantages, batch.mask, 0.2)
    loss.backward()
    seconds = time.perf_counter() - start
    return {"peak_mb": (_peak_kb() - before) / 1024, "seconds": seconds, "tokens": rows * length,
            "loss": float(loss)}


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _resident_kb() -> int:
    return _status_kb("VmRSS")


def _peak_kb() -> int:
    return _status_kb("VmHWM")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak resident set size to the current one


def report(results: dict[str, list[dict]], args) -> None:
    table = Table(title=f"forward + GRPO loss + backward, {args.rows} x {args.length} tokens, vocabulary "
                        f"{QWEN_VOCABULARY:,}, 2 threads, median of {args.rounds} alternating rounds")
    for column in ("path", "peak MB", "seconds", "tokens/s", "loss", "peak vs full"):
        table.add_column(column, justify="right")
    full_peak = statistics.median(r["peak_mb"] for r in results["full-vocabulary"])
    for path, runs in results.items():
        peak = statistics.median(r["peak_mb"] for r in runs)
        seconds = statistics.median(r["seconds"] for r in runs)
        table.add_row(path, f"{peak:,.0f}", f"{seconds:.2f}", f"{runs[0]['tokens'] / seconds:,.0f}",
                      f"{runs[0]['loss']:.6f}", f"{full_peak / peak:.1f}x less" if path != PATHS[0] else "")
    Console().print(table)


if __name__ == "__main__":
    main()
