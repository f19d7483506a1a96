"""Policy model, inference engine, supervised warm-up and GRPO training. Never imports dagster.

Modules (one idea each):
    tokenizer   byte-level BPE tokenizer (frozen vocabulary) + ChatML template
    model       PolicyConfig, build_base_policy, load_policy (small Llama)
    checkpoint  atomic save_checkpoint / verify_checkpoint with a sha256 manifest
    prompts     render_prompt, extract_solution
    engine      SamplingParams, Completion, InferenceEngine, TransformersEngine
    batching    teacher-forced token logprobs shared by SFT and GRPO
    sft         SFTConfig, supervised_warmup
    grpo        advantage estimators (GRPO, RLOO, REINFORCE++), clipped_policy_loss, KL (pure functions)
    schedule    learning-rate schedules
    trainer     GRPOConfig, TrainSample, train_policy
    resume      progress saved between optimizer steps, resumed after a crash
    step        TrainJob: one training step by locations, as its own process runs it
    lineage     what a checkpoint descends from (parent, data, task set, settings, code)
    monitors    stability signals judged against thresholds
    dynamic_sampling  refill a batch whose groups carry no signal (DAPO)
    evaluation  held-out pass rates with task-clustered and paired standard errors
    rollout, episodes, actions, demonstrations, trajectory, experiment, engines: the sampling side
"""
