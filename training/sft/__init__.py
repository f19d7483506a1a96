"""The supervised warm-up of the built-in base policy, its demonstrations, and the vocabulary
that policy's tokenizer was learned from."""
