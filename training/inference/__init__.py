"""Token-in / token-out engines that sample from a checkpoint: transformers (CPU), vLLM (GPU) and
any OpenAI-compatible server."""
