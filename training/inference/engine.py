"""Token-in / token-out inference: prompts are token ids, completions are token ids + logprobs.

`InferenceEngine` is the interface the rollout code depends on; transformers_engine.py,
vllm_engine.py and http_engine.py implement it, and engines.py opens the one an experiment names.

Behaviour log-probs are taken under the distribution the token was actually SAMPLED from:
log_softmax of the processed scores, i.e. logits / temperature, then top-p (-inf outside the
nucleus). The trainer recomputes log_softmax(logits / temperature); the two agree exactly
when top_p == 1.0, which is what RL sampling should use. With temperature == 0 (greedy) the
logprobs are those of the untempered distribution, log_softmax(logits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from training.policy.chat import ChatFormat

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    n: int = 4  # completions per prompt (the GRPO group size)
    max_new_tokens: int = 128  # response budget; a reference solution is ~30-120 bytes
    temperature: float = 1.0  # 1.0 = sample from the policy itself (on-policy RL); 0 = greedy
    top_p: float = 1.0  # keep 1.0 for RL so behaviour and trainer logprobs match
    # Same prompts + params + checkpoint -> same completions (for an engine that caches prefixes:
    # after the same earlier calls, whose keys and values it re-uses)
    seed: int = 0


def request_seed(seed: int, sample: int) -> int:
    """The seed of one request to an engine that seeds every request on its own (vLLM, an
    OpenAI-compatible server), `sample` the index in the call of the request's first sample:
    requests with the same seed and prompt sample alike, and the episodes of one task start from
    the same prompt in one call. Spread by a prime far above any call's seed offset (turns, waves)."""
    return (seed + sample * 1_000_003) % 2**31


@dataclass
class Completion:
    token_ids: list[int]  # generated ids, including the stop token when finish_reason == "stop"
    # Behaviour logprob of each token in token_ids; None where the engine cannot say (an HTTP
    # server that returns text only): such a completion is for evaluation, never for training.
    logprobs: list[float] | None
    finish_reason: FinishReason  # "stop": emitted one of the engine's stop tokens; "length": hit max_new_tokens
    text: str  # decode(token_ids), special tokens kept (ChatFormat.reply_text cuts the stop token off)


@runtime_checkable
class InferenceEngine(Protocol):
    policy_version: str
    chat: ChatFormat  # the sampled model's chat format: what renders its prompts and ends its replies

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 conversations: list[list[dict[str, str]]] | None = None) -> list[list[Completion]]:
        """params.n completions for each prompt, in prompt order. `conversations` are the
        prompts' messages (which the ids render), for an engine that applies a server's
        template instead of taking ids."""
        ...
