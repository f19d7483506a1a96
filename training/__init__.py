"""Policy model, inference engine, supervised warm-up and GRPO training. Never imports dagster.

Modules (one idea each):
    tokenizer   byte-level tokenizer + ChatML template
    model       PolicyConfig, build_base_policy, load_policy (small Llama)
    checkpoint  atomic save_checkpoint / verify_checkpoint with a sha256 manifest
    prompts     render_prompt, extract_solution
    engine      SamplingParams, Completion, InferenceEngine, TransformersEngine
    batching    teacher-forced token logprobs shared by SFT and GRPO
    sft         SFTConfig, supervised_warmup
    grpo        advantage estimators (GRPO, RLOO, REINFORCE++), clipped_policy_loss (pure functions)
    trainer     GRPOConfig, TrainSample, train_policy
"""
