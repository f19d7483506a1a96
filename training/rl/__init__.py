"""Reinforcement learning: advantage estimators and the clipped loss (pure functions), the
trainer and its settings, learning-rate schedules, resumable progress, and the step job that
runs it as a process of its own."""
