"""The OpenAI-compatible HTTP engine: any server with `/v1/completions` or `/v1/chat/completions`
(vllm serve, SGLang, hosted APIs), behind the same token-in / token-out interface as the local
engines.

- `api="completions"` (default): prompts go out as token ids (the completions API takes a list
  of ids as `prompt`).
- `api="chat"`: for chat-only servers. The prompts' conversations (the messages their ids
  render) go out, and the server applies its own model's chat template.
What comes back is trainable only if the server says exactly which tokens it sampled and their
log-probs: vLLM and SGLang do on the completions API, with `logprobs` and
`return_tokens_as_token_ids` ("token_id:123"). Anything else (chat answers, most hosted APIs)
yields completions whose ids are the text re-tokenised here and whose `logprobs` is None: fine
for evaluation, never trained on, because re-tokenised text is not what the policy sampled.

Requests for different prompts run concurrently; a connection error or a 5xx is retried with
backoff, a 4xx is an EngineError carrying the server's message. A server that ignores `n`
(`transformers serve` answers one choice) is asked once per sample. Every request has a seed of its
own (`request_seed`): a server seeds each one alone, and an episode group's first turn sends
the same prompt several times.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import requests

from training.inference.engine import Completion, FinishReason, SamplingParams, request_seed
from training.policy.chat import ChatFormat

TOKEN_ID_PREFIX = "token_id:"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class EngineError(RuntimeError):
    """The server could not be reached, refused the request, or answered off-protocol."""


class OpenAICompatibleEngine:
    def __init__(
        self, base_url: str, model: str, chat: ChatFormat, policy_version: str | None = None, api_key: str | None = None,
        timeout_s: float = 300.0, retries: int = 3, concurrency: int = 8,
        api: Literal["completions", "chat"] = "completions",
    ) -> None:
        self.api = api
        self.url = base_url.rstrip("/") + ("/v1/chat/completions" if api == "chat" else "/v1/completions")
        self.model, self.chat = model, chat
        self.policy_version = policy_version or f"http:{model}"
        self.timeout_s, self.retries, self.concurrency = timeout_s, retries, concurrency
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 conversations: list[list[dict[str, str]]] | None = None) -> list[list[Completion]]:
        """params.n completions for each prompt, in prompt order; the chat API sends the
        prompts' `conversations`."""
        if self.api == "chat" and (conversations is None or len(conversations) != len(prompts)):
            raise EngineError("the chat API sends messages, and these prompts came without their conversations")
        work = list(zip(range(0, len(prompts) * params.n, params.n), prompts, conversations or [None] * len(prompts)))
        with requests.Session() as session, ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda item: self._complete(session, *item, params), work))

    def _complete(self, session: requests.Session, first_sample: int, prompt: list[int],
                  messages: list[dict[str, str]] | None, params: SamplingParams) -> list[Completion]:
        body = {"model": self.model, "n": params.n, "max_tokens": params.max_new_tokens,
                "temperature": params.temperature, "top_p": params.top_p,
                "seed": request_seed(params.seed, first_sample)}
        if self.chat.stop_strings:  # a completion template's; the server ends the text before them
            body["stop"] = list(self.chat.stop_strings)
        if self.api == "chat":
            body["messages"] = messages
        else:
            body |= {"prompt": prompt, "logprobs": 1, "return_tokens_as_token_ids": True}
        choices = self._choices(session, body)
        if len(choices) == 1 and params.n > 1:  # a server that ignores `n` (transformers serve): one request each
            choices += [self._choices(session, body | {"n": 1, "seed": request_seed(params.seed, first_sample + i)})[0]
                        for i in range(1, params.n)]
        elif len(choices) != params.n:
            raise EngineError(f"{self.url}: expected {params.n} choices, got {len(choices)}")
        return [self._completion(choice) for choice in choices]

    def _choices(self, session: requests.Session, body: dict) -> list[dict]:
        answer = self._post(session, body)
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or not choices or not all(isinstance(c, dict) for c in choices):
            raise EngineError(f"{self.url}: expected a list of choices, got {_describe(choices)}")
        return sorted(choices, key=lambda c: c.get("index", 0))

    def _post(self, session: requests.Session, body: dict) -> dict:
        for attempt in range(self.retries + 1):
            try:
                response = session.post(self.url, json=body, headers=self.headers, timeout=self.timeout_s)
            except requests.RequestException as e:
                problem = f"cannot reach {self.url}: {type(e).__name__}: {e}"
            else:
                if response.status_code == 200:
                    try:
                        return response.json()
                    except ValueError:
                        raise EngineError(f"{self.url}: the answer is not JSON: {response.text[:200]!r}") from None
                problem = f"{self.url}: HTTP {response.status_code}: {_server_message(response)}"
                if response.status_code not in RETRY_STATUSES:
                    raise EngineError(problem)
            if attempt < self.retries:
                time.sleep(min(2.0**attempt * 0.5, 10.0))
        raise EngineError(f"{problem} (after {self.retries} retries)")

    def _completion(self, choice: dict) -> Completion:
        message = choice.get("message")
        text = (message.get("content") if isinstance(message, dict) else choice.get("text")) or ""
        finish: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
        sampled = _sampled_tokens(choice.get("logprobs"))
        if sampled is None:
            return Completion(token_ids=self.chat.encode(text), logprobs=None, finish_reason=finish, text=text)
        token_ids, logprobs = sampled
        return Completion(token_ids=token_ids, logprobs=logprobs, finish_reason=finish, text=text)


def _sampled_tokens(logprobs: object) -> tuple[list[int], list[float]] | None:
    """The sampled token ids and their log-probs, if the server gave both for every token."""
    if not isinstance(logprobs, dict):
        return None
    tokens, values = logprobs.get("tokens"), logprobs.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
        return None
    try:
        ids = [int(token.removeprefix(TOKEN_ID_PREFIX)) for token in tokens if token.startswith(TOKEN_ID_PREFIX)]
        return (ids, [float(v) for v in values]) if len(ids) == len(tokens) else None
    except (AttributeError, TypeError, ValueError):
        return None


def _server_message(response: requests.Response) -> str:
    try:
        error = response.json().get("error", {})
        return str(error.get("message", error) if isinstance(error, dict) else error)[:500]
    except (ValueError, AttributeError):
        return response.text[:500]


def _describe(value: object) -> str:
    return f"{len(value)}" if isinstance(value, list) else type(value).__name__
