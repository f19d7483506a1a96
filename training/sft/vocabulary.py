"""The built-in policy's frozen vocabulary, relearned from what it reads and writes on the
built-in sets' train splits: `python -m training.sft.vocabulary` (training/policy/tokenizer.py
keeps the result, tokenizer.json). Only train text: nothing of a held-out task shapes it."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from task_sets.loader import builtin_task_set_names, load_task_set
from training.agent.episodes import SYSTEM_MESSAGE as EPISODE_SYSTEM_MESSAGE
from training.agent.prompts import SYSTEM_MESSAGE
from training.policy.tokenizer import VOCABULARY_FILE, VOCABULARY_SIZE, learn_vocabulary


def builtin_train_texts() -> Iterator[str]:
    """What the policy reads and writes on the built-in sets' train splits, as often as it reads
    them: for every task its prompt, reference solution and starting files, and the system
    message its prompt starts with (an episode's where the task is solved by running its check)."""
    for name in builtin_task_set_names():
        for task in load_task_set(name).train():
            yield EPISODE_SYSTEM_MESSAGE if task.check_command else SYSTEM_MESSAGE
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
