"""The one optimizer loop of every training Crucible does (the warm-up and the RL step): its
settings (where it runs and in what pieces), the placement (device, precision, data parallel
ranks under torchrun), AdamW and its schedules, micro-batched steps, resumable progress, and
the save that keeps the parent's dtype."""
