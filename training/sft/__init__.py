"""The supervised warm-up of an experiment's base policy (on training/optim/'s loop, as a job of
its own), its demonstrations, and the vocabulary the built-in policy's tokenizer was learned from."""
