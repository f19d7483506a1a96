"""TransformersEngine: batched sampling with Hugging Face `generate`, on CPU by default."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import GenerationConfig

from training.inference.engine import Completion, FinishReason, SamplingParams
from training.policy.chat import ChatFormat
from training.policy.model import load_policy


class TransformersEngine:
    """Batched sampling with Hugging Face `generate` on CPU (or whatever device the model is on)."""

    def __init__(
        self,
        checkpoint_dir: str | Path,
        policy_version: str,
        # None: a thread per CPU this process may run on, set explicitly so that the count never
        # depends on what ran before in the process (the warm-up sets its own). Generation and an
        # episode's actions take turns, so generation has the cores to itself: on the 2-core box a
        # repair iteration's 1,536 turns generated the same tokens in 54 s with 2 threads, 64 s with 1.
        threads: int | None = None,
        batch_size: int = 64,  # sequences (prompt copies) per generate call
        static_cache: bool = True,  # preallocated KV cache: ~25% faster than DynamicCache on CPU
        observation_role: str = "user",  # the chat role of an episode's observations
    ) -> None:
        torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
        self.checkpoint_dir = Path(checkpoint_dir)
        self.policy_version = policy_version
        self.batch_size = batch_size
        self.static_cache = static_cache
        self.model, self.tokenizer = load_policy(self.checkpoint_dir)
        self.chat = ChatFormat.of(self.tokenizer, self.model.generation_config, observation_role)
        self.pad_id, self.stop_ids = self.chat.pad_id, list(self.chat.stop_ids)
        self.max_positions = int(self.model.config.max_position_embeddings)

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 conversations: list[list[dict[str, str]]] | None = None) -> list[list[Completion]]:
        """params.n completions for each prompt (its ids; `conversations` are not needed)."""
        self._check(prompts, params)
        # n copies of each prompt; sorted by length so that batches hold similar lengths.
        flat = [i for i in range(len(prompts)) for _ in range(params.n)]
        order = sorted(range(len(flat)), key=lambda k: len(prompts[flat[k]]))
        results: list[Completion | None] = [None] * len(flat)
        config = self._generation_config(params)
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(params.seed)
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                batch = [prompts[flat[k]] for k in chunk]
                for k, completion in zip(chunk, self._generate_batch(batch, config)):
                    results[k] = completion
        return [results[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]  # type: ignore[misc]

    def _check(self, prompts: list[list[int]], params: SamplingParams) -> None:
        if params.n < 1 or params.max_new_tokens < 1:
            raise ValueError(f"need n >= 1 and max_new_tokens >= 1, got {params}")
        if not 0.0 < params.top_p <= 1.0 or params.temperature < 0:
            raise ValueError(f"need 0 < top_p <= 1 and temperature >= 0, got {params}")
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty")
            if len(p) + params.max_new_tokens > self.max_positions:
                raise ValueError(
                    f"prompt {i}: {len(p)} tokens + max_new_tokens {params.max_new_tokens} "
                    f"> max_position_embeddings {self.max_positions}"
                )

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        sample = params.temperature > 0
        return GenerationConfig(
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_p=params.top_p if sample else None,
            top_k=0 if sample else None,  # transformers defaults to top_k=50 otherwise
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            bos_token_id=None,
            return_dict_in_generate=True,
            output_scores=True,  # processed scores: exactly the distribution sampled from
            cache_implementation="static" if self.static_cache else None,
            disable_compile=True,  # no torch.compile per batch shape (transformers would on GPU)
        )

    def _generate_batch(self, batch: list[list[int]], config: GenerationConfig) -> list[Completion]:
        width = max(len(p) for p in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, p in enumerate(batch):  # left padding
            input_ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention_mask[row, width - len(p) :] = 1
        out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
        new_tokens = out.sequences[:, width:]
        scores = torch.stack(out.scores, dim=1).float()  # [batch, steps, vocab]
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        return [self._completion(t, lp) for t, lp in zip(new_tokens.tolist(), logprobs.tolist())]

    def _completion(self, tokens: list[int], logprobs: list[float]) -> Completion:
        stop = next((i for i, t in enumerate(tokens) if t in self.stop_ids), None)
        if stop is None:
            reason: FinishReason = "length"
        else:
            tokens, logprobs, reason = tokens[: stop + 1], logprobs[: stop + 1], "stop"
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        return Completion(token_ids=tokens, logprobs=logprobs, finish_reason=reason, text=text)
