"""The learning side of the loop, one subpackage per stage; never imports dagster.

    progress     progress counts as log lines worth reading (kept only when they change)
    policy/      the model: config, built-in tokenizer, chat format, checkpoints, import of a
                 user's model, lineage, teacher-forced log-probs
    optim/       the one optimizer loop of the warm-up and the RL step: where it runs (device,
                 precision, ranks), AdamW and its schedules, micro-batched steps, resume, the save
    inference/   engines that sample from a checkpoint: transformers, vLLM, OpenAI-compatible HTTP
    agent/       how a policy acts on a task: prompts, single replies, multi-turn episodes and
                 their actions, dynamic sampling, the rows a graded sample becomes
    sft/         the supervised warm-up, its job, its demonstrations and the built-in vocabulary
    rl/          GRPO-family advantages and losses, how samples go through the policy, the trainer,
                 the step job
    evaluation/  the stability and sample monitors
    experiment   ExperimentConfig: every setting of an experiment
    base_policy  an experiment's starting model: the built-in one or an imported one, warmed up
    iteration    one RL iteration's rules, which the Dagster assets call
    model_eval   a model's evaluation without training (`crucible eval`)
    continuation when continuous training of an experiment stops (the sensor's rules)

Imports point down that list (policy is the bottom; experiment may use them all).
"""
