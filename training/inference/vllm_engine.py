"""The vLLM engine: offline batch generation on GPU (`pip install -e '.[gpu]'`), loading the
same Hugging Face checkpoint directory as the CPU engine.

Prompts go in as token ids (`TokensPrompt`), and each completion comes back with vLLM's own
sampled token ids and the log-prob of each, taken after temperature and top-p
(`logprobs_mode="processed_logprobs"`), which is the distribution the token was drawn from, as
in TransformersEngine. vLLM needs CUDA, so this module imports it only when an engine is built.
"""

from __future__ import annotations

from pathlib import Path

from training.inference.engine import Completion, FinishReason, SamplingParams
from training.policy.chat import ChatFormat


class VLLMEngine:
    def __init__(self, checkpoint_dir: str | Path, policy_version: str, seed: int = 0, **llm_options) -> None:
        import vllm  # the optional GPU extra

        self.checkpoint_dir = Path(checkpoint_dir)
        self.policy_version = policy_version
        self.chat = ChatFormat.from_pretrained(self.checkpoint_dir)  # the CPU engine's stop ids too
        self.stop_ids = list(self.chat.stop_ids)
        self._vllm = vllm
        self.llm = vllm.LLM(model=str(self.checkpoint_dir), tokenizer=str(self.checkpoint_dir), seed=seed,
                            logprobs_mode="processed_logprobs", **llm_options)

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 conversations: list[list[dict[str, str]]] | None = None) -> list[list[Completion]]:
        """params.n completions for each prompt (its ids; `conversations` are not needed)."""
        sampling = self._vllm.SamplingParams(
            n=params.n, max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
            seed=params.seed, logprobs=0, stop_token_ids=self.stop_ids, skip_special_tokens=False,
        )
        outputs = self.llm.generate([self._vllm.TokensPrompt(prompt_token_ids=p) for p in prompts], sampling,
                                    use_tqdm=False)
        return [[self._completion(c) for c in output.outputs] for output in outputs]

    @staticmethod
    def _completion(output) -> Completion:
        token_ids = list(output.token_ids)
        # logprobs=0: each position holds the sampled token's entry (and no alternatives).
        logprobs = [float(position[token].logprob) for token, position in zip(token_ids, output.logprobs)]
        finish: FinishReason = "length" if output.finish_reason == "length" else "stop"
        return Completion(token_ids=token_ids, logprobs=logprobs, finish_reason=finish, text=output.text)
