"""The built-in policy's frozen vocabulary, relearned from what it reads and writes on the
built-in sets' train splits: `python -m training.sft.vocabulary` (training/policy/tokenizer.py
keeps the result, tokenizer.json). Only train text: nothing of a held-out task shapes it."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from task_sets.loader import load_task_set
from training.agent.episodes import SYSTEM_MESSAGE as EPISODE_SYSTEM_MESSAGE
from training.agent.prompts import SYSTEM_MESSAGE
from training.policy.tokenizer import VOCABULARY_FILE, VOCABULARY_SIZE, learn_vocabulary


VOCABULARY_SETS = ("compose", "default", "repair", "shopcart")
ROLES = ("system", "user", "assistant")


def builtin_train_texts() -> Iterator[str]:
    """What the policy reads and writes on the train splits of VOCABULARY_SETS, as often as it
    reads it: per task, the chat template's role names, the system message its samples open with
    (an episode's for a task with a check command), the prompt, the reference solution and the
    starting files. Weighted so, the usage of actions every episode reads merges into few tokens:
    a 3-turn repair episode takes ~230 tokens, not the ~375 of a vocabulary that saw it once."""
    for name in VOCABULARY_SETS:
        for task in load_task_set(name).train():
            yield from ROLES
            yield SYSTEM_MESSAGE if task.check_command is None else EPISODE_SYSTEM_MESSAGE
            yield task.prompt
            yield task.reference_solution
            yield from task.files.values()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Relearn the frozen BPE vocabulary from the built-in train splits.")
    parser.add_argument("--out", type=Path, default=VOCABULARY_FILE)
    parser.add_argument("--vocab-size", type=int, default=VOCABULARY_SIZE)
    args = parser.parse_args(argv)
    tokenizer = learn_vocabulary(builtin_train_texts(), args.vocab_size)
    tokenizer.save(str(args.out))
    print(f"wrote {tokenizer.get_vocab_size()} tokens to {args.out}")


if __name__ == "__main__":
    main()
