"""How the policy acts on a task: prompts and solution extraction, single-turn rollouts,
multi-turn episodes and their action format, dynamic sampling, and the rows a graded sample
becomes."""
