"""The vLLM engine: offline batch generation on GPU (`pip install -e '.[gpu]'`), loading the
same Hugging Face checkpoint directory as the CPU engine. Written against vLLM 0.33.0.

Prompts go in as token ids (`TokensPrompt`), and each completion comes back with vLLM's own
sampled token ids and the log-prob of each, taken after temperature and top-p
(`logprobs_mode="processed_logprobs"`), which is the distribution the token was drawn from, as
in TransformersEngine. The engine runs in the trainer's dtype, so the two agree on log-probs.

One engine serves a whole run (training/inference/engines.py): a later checkpoint of the same
lineage is loaded into it in place (the worker's `reload_weights`), and while the training step
runs the engine can sleep, giving its GPU memory back. vLLM needs CUDA, so this module imports
it only when an engine is built.
"""

from __future__ import annotations

from pathlib import Path

from training.inference.engine import Completion, FinishReason, SamplingParams, request_seed
from training.inference.settings import VLLMSettings
from training.policy.chat import ChatFormat
from training.policy.settings import GPU_COMPUTE_DTYPE


class VLLMEngine:
    def __init__(self, checkpoint_dir: str | Path, policy_version: str, settings: VLLMSettings = VLLMSettings(),
                 max_model_len: int | None = None, seed: int = 0, observation_role: str = "user") -> None:
        import vllm  # the optional GPU extra

        self._vllm = vllm
        self.llm = vllm.LLM(
            model=str(checkpoint_dir), tokenizer=str(checkpoint_dir), seed=seed, dtype=GPU_COMPUTE_DTYPE,
            gpu_memory_utilization=settings.gpu_memory_utilization, tensor_parallel_size=settings.tensor_parallel_size,
            max_model_len=settings.max_model_len or max_model_len, enable_sleep_mode=settings.enable_sleep_mode,
            logprobs_mode="processed_logprobs", enable_prefix_caching=True,
        )
        self.sleeps, self.observation_role = settings.enable_sleep_mode, observation_role
        self._serve(checkpoint_dir, policy_version)

    def _serve(self, checkpoint_dir: str | Path, policy_version: str) -> None:
        self.checkpoint_dir, self.policy_version = Path(checkpoint_dir), policy_version
        self.chat = ChatFormat.from_pretrained(self.checkpoint_dir, self.observation_role)  # stop ids as on CPU
        self.stop_ids = list(self.chat.stop_ids)

    def load(self, checkpoint_dir: str | Path, policy_version: str, observation_role: str = "user") -> None:
        """Sample `checkpoint_dir` (content hash `policy_version`) from now on: its weights
        replace the live engine's in place (engines.py keeps one engine per architecture and
        tokenizer), and the prefix cache, computed by the old weights, is dropped."""
        self.observation_role = observation_role
        if (Path(checkpoint_dir), policy_version) != (self.checkpoint_dir, self.policy_version):
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(checkpoint_dir)})
            self.llm.reset_prefix_cache()
        self._serve(checkpoint_dir, policy_version)

    def sleep(self) -> None:
        """Free the GPU for the training step: weights to CPU memory, the KV cache dropped."""
        if self.sleeps:
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        if self.sleeps:
            self.llm.wake_up()

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 conversations: list[list[dict[str, str]]] | None = None) -> list[list[Completion]]:
        """params.n completions for each prompt (its ids; `conversations` are not needed)."""
        sampling = [self._vllm.SamplingParams(
            n=params.n, max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
            seed=request_seed(params.seed, index * params.n), logprobs=0, stop_token_ids=self.stop_ids,
            # A completion template's stop strings: kept in the text, as they are in the sampled ids
            stop=list(self.chat.stop_strings) or None, include_stop_str_in_output=True, skip_special_tokens=False,
        ) for index in range(len(prompts))]
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
