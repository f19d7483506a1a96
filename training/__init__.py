"""The learning side of the loop, one subpackage per stage; never imports dagster.

    policy/      the model: config, built-in tokenizer, chat format, checkpoints, import of a
                 user's model, lineage, teacher-forced log-probs
    inference/   engines that sample from a checkpoint: transformers, vLLM, OpenAI-compatible HTTP
    agent/       how a policy acts on a task: prompts, single replies, multi-turn episodes and
                 their actions, dynamic sampling, the rows a graded sample becomes
    sft/         the supervised warm-up, its demonstrations and the built-in vocabulary
    rl/          GRPO-family advantages and losses, the trainer, its schedule and resume, the step job
    evaluation/  the stability and sample monitors
    experiment   ExperimentConfig: every setting of an experiment
    base_policy  an experiment's starting model: the built-in one or an imported one, warmed up
    iteration    one RL iteration's rules, which the Dagster assets call
    model_eval   a model's evaluation without training (`crucible eval`)
    continuation when continuous training of an experiment stops (the sensor's rules)

Imports point down that list (policy is the bottom; experiment may use them all).
"""
