"""The policy itself: the built-in model's config and tokenizer, checkpoints (atomic, hashed,
with lineage), and teacher-forced log-probs through any causal LM."""
