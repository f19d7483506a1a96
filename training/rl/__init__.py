"""Reinforcement learning: advantage estimators and the clipped loss (pure functions), how a
step's samples go through the policy, the trainer and its settings, and the step job that runs
it as a process of its own. The optimizer loop it runs is training/optim/."""
