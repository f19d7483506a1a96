"""TransformersEngine: batched sampling with a Hugging Face causal LM, on CPU by default.

The decoding loop is the engine's own (the model's forward with a Cache, transformers'
top-p warper) rather than `generate`, for what generate cannot do across calls:
- prefix caching (training/inference/prefix_cache.py): a prompt that extends a sequence the last
  call produced (an episode's next turn) prefills only its new tokens; the batch is laid out
  [cached keys and values, right-aligned | new tokens, right-aligned], the holes masked, positions
  counted over the mask, so every token keeps the position it was computed at; copies of one
  prompt (a group's first turn) share one prefill of it;
- a row leaves the batch when it stops, so short replies cost nothing while long ones finish;
- a grouped-query model attends over its cache in place (training/inference/grouped_attention.py),
  where transformers' sdpa attention would copy it once per query head at every step.
"""

from __future__ import annotations

import inspect
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer
from transformers.generation.logits_process import TopPLogitsWarper

from training.inference.engine import Completion, FinishReason, SamplingParams
from training.inference.grouped_attention import use_grouped_attention
from training.inference.prefix_cache import CachedPrefix, PrefixCache
from training.policy.chat import ChatFormat
from training.policy.model import load_policy


class TransformersEngine:
    """Batched sampling with prefix caching on CPU (or whatever device the model is on)."""

    def __init__(
        self,
        checkpoint_dir: str | Path,
        policy_version: str,
        # None: a thread per CPU this process may run on, set explicitly so that the count never
        # depends on what ran before in the process (the warm-up sets its own). Generation and an
        # episode's actions take turns, so generation has the cores to itself: on the 2-core box a
        # repair iteration's 1,536 turns generated the same tokens in 54 s with 2 threads, 64 s with 1.
        threads: int | None = None,
        batch_size: int = 64,  # sequences (prompt copies) per forward
        observation_role: str = "user",  # the chat role of an episode's observations
        # Keys and values kept between calls (0: no prefix caching). The default model's are 8 KiB
        # a token: a repair iteration's 512 episodes take ~1 GiB at their longest.
        prefix_cache_bytes: int = 2 << 30,
        # Where a long call says how far it is (replies ended, tokens, tokens/s), every
        # `progress_every_s`: on a CPU one call can decode for many minutes.
        log: Callable[[str], None] | None = None,
        progress_every_s: float = 30.0,
    ) -> None:
        torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
        self.checkpoint_dir = Path(checkpoint_dir)
        self.policy_version = policy_version
        self.batch_size = batch_size
        self.prefix_cache_bytes = prefix_cache_bytes
        self.model, self.tokenizer = load_policy(self.checkpoint_dir)
        use_grouped_attention(self.model)
        self.chat = ChatFormat.of(self.tokenizer, self.model.generation_config, observation_role)
        self.pad_id, self.stop_ids = self.chat.pad_id, list(self.chat.stop_ids)
        self.max_positions = int(self.model.config.max_position_embeddings)
        self.takes_positions = "position_ids" in inspect.signature(self.model.forward).parameters
        if not (self.takes_positions and _window_spans(self.model.config, 2 * self.max_positions)):
            self.prefix_cache_bytes = 0  # see _window_spans: holes would change what a token attends to
        self.prefixes = PrefixCache(self.prefix_cache_bytes)
        self.prefilled_tokens = 0  # prompt tokens run through the model, over the engine's life
        self.reused_tokens = 0  # prompt tokens whose keys and values came from the prefix cache
        self.log, self.progress_every_s = log, progress_every_s

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 conversations: list[list[dict[str, str]]] | None = None) -> list[list[Completion]]:
        """params.n completions for each prompt (its ids; `conversations` are not needed)."""
        self._check(prompts, params)
        flat = [i for i in range(len(prompts)) for _ in range(params.n)]
        with torch.inference_mode():
            shared = self._prefill_shared([prompts[i] for i in flat])
        found = {tuple(p): max(self.prefixes.longest_prefix(p), shared.longest_prefix(p), key=_length) for p in prompts}
        hits = [found[tuple(prompts[i])] for i in flat]
        # What this call re-uses stays alive through `hits`; the cache then holds what this call
        # produces: an episode's next turn extends its last one, and nothing else would match.
        self.prefixes = PrefixCache(self.prefix_cache_bytes)
        # Sorted by the tokens left to prefill, so that batches hold similar shapes.
        order = sorted(range(len(flat)), key=lambda k: len(prompts[flat[k]]) - _length(hits[k]))
        results: list[Completion | None] = [None] * len(flat)
        progress = DecodeProgress(len(flat), self.log, self.progress_every_s)
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(params.seed)
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                rows = [(prompts[flat[k]], hits[k]) for k in chunk]
                for k, completion in zip(chunk, self._generate_batch(rows, params, self.prefixes, progress)):
                    results[k] = completion
        return [results[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]  # type: ignore[misc]

    def _prefill_shared(self, prompts: list[list[int]]) -> PrefixCache:
        """A prompt several rows start from (a group's first turn: its episodes, or n copies) is
        prefilled once, up to its last token: each copy then feeds one token."""
        shared = PrefixCache(self.prefix_cache_bytes)
        copies = Counter(tuple(p) for p in prompts) if self.prefix_cache_bytes else Counter()
        starts = [list(p[:-1]) for p, count in copies.items()
                  if count > 1 and len(p) > 1 and _length(self.prefixes.longest_prefix(p)) < len(p) - 1]
        for start in range(0, len(starts), self.batch_size):
            rows = [(ids, self.prefixes.longest_prefix(ids)) for ids in starts[start : start + self.batch_size]]
            cache, mask, _, _ = self._prefill(rows, max_new_tokens=0)
            for row, (ids, _) in enumerate(rows):
                _keep(ids, cache, row, mask[row], shared)
        return shared

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

    def _generate_batch(self, rows: list[tuple[list[int], CachedPrefix | None]], params: SamplingParams,
                        produced: PrefixCache, progress: DecodeProgress) -> list[Completion]:
        """Sample one completion per row; each row's sequence (less its last sampled token, whose
        keys and values were never computed) goes into `produced`."""
        cache, mask, positions, logits = self._prefill(rows, params.max_new_tokens)
        live = list(range(len(rows)))  # the batch's rows, as indices into `rows`
        tokens: list[list[int]] = [[] for _ in rows]
        logprobs: list[list[float]] = [[] for _ in rows]
        for step in range(params.max_new_tokens):
            token, logprob = _sample(logits, params)
            for row, t, lp in zip(live, token.tolist(), logprob.tolist()):
                tokens[row].append(t)
                logprobs[row].append(lp)
            last = step == params.max_new_tokens - 1
            stopped = torch.tensor([last or t in self.stop_ids or self.chat.ends_in_stop_string(tokens[row])
                                    for row, t in zip(live, token.tolist())])
            for index in stopped.nonzero().flatten().tolist():
                _keep(rows[live[index]][0] + tokens[live[index]][:-1], cache, index, mask[index], produced)
            progress.step(len(live), int(stopped.sum()))
            if stopped.all():
                break
            if stopped.any():  # a finished row leaves the batch
                keep = (~stopped).nonzero().flatten()
                cache.batch_select_indices(keep)
                live, mask, positions, token = [live[i] for i in keep.tolist()], mask[keep], positions[keep], token[keep]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
            positions = positions + 1
            logits = self._forward(token.unsqueeze(1), mask, positions, cache)
        return [self._completion(t, lp) for t, lp in zip(tokens, logprobs)]

    def _prefill(self, rows: list[tuple[list[int], CachedPrefix | None]],
                 max_new_tokens: int) -> tuple[Cache, Tensor, Tensor, Tensor]:
        """Run the rows' uncached tokens through the model: the batch's cache (room for
        `max_new_tokens` more), attention mask, each row's last position and next-token logits."""
        past = max(_length(hit) for _, hit in rows)
        fresh = [ids[_length(hit):] for ids, hit in rows]
        width = max(len(ids) for ids in fresh)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), past + width), dtype=torch.long)
        for row, ((_, hit), ids) in enumerate(zip(rows, fresh)):
            input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            mask[row, past - _length(hit):past] = 1
            mask[row, past + width - len(ids):] = 1
        cache = Cache(layers=[InPlaceLayer(past + width + max_new_tokens)
                              for _ in range(self.model.config.num_hidden_layers)])
        hits = [hit for _, hit in rows]
        for layer in range(len(cache.layers) if past else 0):
            cache.update(_stacked([hit.keys[layer] if hit else None for hit in hits], past),
                         _stacked([hit.values[layer] if hit else None for hit in hits], past), layer)
        # Positions counted over the mask: a token sits where it was computed, holes or not.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
        self.reused_tokens += sum(_length(hit) for hit in hits)
        self.prefilled_tokens += sum(len(ids) for ids in fresh)
        return cache, mask, positions[:, -1:], self._forward(input_ids, mask, positions, cache)

    def _forward(self, input_ids: Tensor, mask: Tensor, positions: Tensor, cache: Cache) -> Tensor:
        given = {"position_ids": positions} if self.takes_positions else {}  # else the model counts them itself
        out = self.model(input_ids=input_ids, attention_mask=mask, past_key_values=cache, use_cache=True,
                         logits_to_keep=1, **given)
        return out.logits[:, -1].float()

    def _completion(self, tokens: list[int], logprobs: list[float]) -> Completion:
        stopped = tokens[-1] in self.stop_ids or self.chat.ends_in_stop_string(tokens)
        reason: FinishReason = "stop" if stopped else "length"
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        return Completion(token_ids=tokens, logprobs=logprobs, finish_reason=reason, text=text)


class DecodeProgress:
    """One generate call's progress: replies ended, tokens sampled and tokens/s, as a log line
    every `every_s` seconds (none for a call shorter than that)."""

    def __init__(self, replies: int, log: Callable[[str], None] | None, every_s: float):
        self.replies, self.log, self.every_s = replies, log, every_s
        self.ended = self.tokens = 0
        self.started = self.logged = time.perf_counter()

    def step(self, sampled: int, ended: int) -> None:
        """A decode step sampled a token for `sampled` rows, of which `ended` stopped."""
        self.tokens += sampled
        self.ended += ended
        now = time.perf_counter()
        if self.log is not None and now - self.logged >= self.every_s:
            self.logged = now
            self.log(f"decoding: {self.ended}/{self.replies} replies ended, {self.tokens:,} tokens sampled, "
                     f"{self.tokens / (now - self.started):.1f} tokens/s")


def _window_spans(config, columns: int) -> bool:
    """Whether every layer attends over at least `columns` columns. A batch with cached prefixes
    has holes between its cached and new tokens; positions are passed explicitly, but a sliding
    window's mask counts columns, so a hole would push tokens out of it."""
    config = config.get_text_config()
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return True
    return window >= columns


def _length(hit: CachedPrefix | None) -> int:
    return len(hit.ids) if hit is not None else 0


def _sample(logits: Tensor, params: SamplingParams) -> tuple[Tensor, Tensor]:
    """The next token of each row and its behaviour log-prob: under the distribution sampled from
    (logits / temperature, then top-p), or the untempered one when greedy (engine.py)."""
    if params.temperature == 0:
        scores = torch.log_softmax(logits, dim=-1)
        token = scores.argmax(dim=-1)
    else:
        scores = logits / params.temperature
        if params.top_p < 1.0:
            scores = TopPLogitsWarper(params.top_p)(None, scores)
        scores = torch.log_softmax(scores, dim=-1)
        token = _inverse_cdf_draw(scores.exp())
    return token, scores.gather(-1, token.unsqueeze(-1)).squeeze(-1)


def _inverse_cdf_draw(probs: Tensor) -> Tensor:
    """One token a row drawn from `probs` with one uniform number a row: torch.multinomial draws
    an exponential for every vocabulary entry, 62 ms a decode step for 64 rows of SmolLM2's 49k on
    a CPU core, this ~17 ms. Cumulated in float64 so that the last tokens of a large vocabulary keep
    their probability; a zero-probability token is never drawn (right=True: the first sum > u)."""
    cumulative = probs.double().cumsum(dim=-1)
    draw = torch.rand((len(probs), 1), dtype=cumulative.dtype) * cumulative[:, -1:]
    return torch.searchsorted(cumulative, draw, right=True).squeeze(1).clamp(max=probs.shape[-1] - 1)


def _keep(ids: list[int], cache: Cache, row: int, row_mask: Tensor, store: PrefixCache) -> None:
    """Store batch row `row`'s keys and values (its masked-in columns) as those of `ids`, if they fit."""
    per_token = sum(layer.keys[row, :, 0].nbytes + layer.values[row, :, 0].nbytes for layer in cache.layers)
    if not store.fits(per_token * len(ids)):
        return
    columns = row_mask.nonzero().flatten()
    store.add(CachedPrefix(tuple(ids), tuple(layer.keys[row][:, columns] for layer in cache.layers),
                           tuple(layer.values[row][:, columns] for layer in cache.layers)))


def _stacked(tensors: list[Tensor | None], past: int) -> Tensor:
    """One layer's cached keys (or values) of a batch: [rows, heads, past, dim], right-aligned."""
    example = next(t for t in tensors if t is not None)
    heads, _, dim = example.shape
    out = example.new_zeros((len(tensors), heads, past, dim))
    for row, tensor in enumerate(tensors):
        if tensor is not None:
            out[row, :, past - tensor.shape[1]:] = tensor
    return out


class InPlaceLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of buffers sized for the batch's call: a
    decode step writes its token in place where DynamicLayer copies the cache (torch.cat), which
    was a quarter of a step's time on CPU."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity, self.length = capacity, 0

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
            rows, heads, _, dim = key_states.shape
            self.key_buffer = key_states.new_empty((rows, heads, self.capacity, dim))
            self.value_buffer = value_states.new_empty((rows, heads, self.capacity, value_states.shape[-1]))
        end = self.length + key_states.shape[-2]
        self.key_buffer[:, :, self.length:end] = key_states
        self.value_buffer[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: Tensor) -> None:
        self.key_buffer, self.value_buffer = self.key_buffer[indices], self.value_buffer[indices]
        self.keys, self.values = self.key_buffer[:, :, :self.length], self.value_buffer[:, :, :self.length]
