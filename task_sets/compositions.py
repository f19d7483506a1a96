"""Generator for the built-in "compose" task set: functions described by a combination of words.

Each family fixes a function and two slots, each slot a closed list of phrases with the code
they mean ("the maximum of a and b" -> `max(a, b)`, "squared" -> `(...) ** 2`); a task is one
combination. Train and eval split the combinations, so every eval task is a combination the
policy never saw, made of phrases it has seen in others: solving it means reading both slots
of the prompt, not recalling a memorised answer. Unlike the "default" set, nothing has to be
copied out of the prompt, which a small model trained from scratch cannot yet do (see
task_sets/generator.py); this is the set the default experiment learns on.

Run `python -m task_sets.compositions` to rewrite `builtin/compose/generated.jsonl`.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from task_sets.generator import write_jsonl
from task_sets.schema import Difficulty, FunctionTask, Task
from task_sets.splits import hash_splits

EVAL_FRACTION = 0.25
DEFAULT_OUTPUT = Path(__file__).parent / "builtin" / "compose" / "generated.jsonl"


@dataclass(frozen=True)
class Family:
    """`signature`'s behaviour is `template` filled with one phrase of each slot; the code is
    `code` filled with the phrases' code; `calls` are the checks the hidden tests pin."""

    name: str
    difficulty: Difficulty
    signature: str
    template: str
    code: str
    first: dict[str, str]
    second: dict[str, str]
    calls: tuple[str, ...]


FAMILIES = (
    Family("combine", "easy", "combine(a, b)", "takes two integers a and b and returns the {} of a and b, {}",
           "{second}", {"sum": "a + b", "difference": "a - b", "product": "a * b", "maximum": "max(a, b)",
                        "minimum": "min(a, b)", "remainder": "a % b"},
           {"doubled": "({}) * 2", "tripled": "({}) * 3", "plus one": "({}) + 1", "minus one": "({}) - 1",
            "squared": "({}) ** 2", "negated": "-({})", "halved": "({}) // 2", "plus two": "({}) + 2",
            "times ten": "({}) * 10"},
           ("combine(3, 5)", "combine(-2, 7)", "combine(4, 4)", "combine(0, -6)")),
    Family("pick", "medium", "pick(xs)", "takes a list of integers xs and returns the {} of its {} elements",
           "{first}([v for v in xs if {second}])", {"sum": "sum", "maximum": "max", "minimum": "min", "count": "len"},
           {"positive": "v > 0", "negative": "v < 0", "even": "v % 2 == 0", "odd": "v % 2 == 1",
            "nonzero": "v != 0", "larger than ten": "v > 10", "larger than five": "v > 5",
            "smaller than three": "v < 3"},
           ("pick([3, -4, 12, 7, -1, 0, 8])", "pick([-5, 2, 15, 9, -12, 4, 11, 0])", "pick([21, -3, 6, -8, 13, 1, 2])")),
    Family("text", "easy", "text(s)", "takes a string s and returns s {}, {}", "{second}",
           {"in upper case": "s.upper()", "in lower case": "s.lower()", "reversed": "s[::-1]",
            "without surrounding spaces": "s.strip()", "in title case": "s.title()",
            "with its case swapped": "s.swapcase()"},
           {"repeated twice": "{} * 2", "followed by an exclamation mark": "{} + '!'",
            "followed by a question mark": "{} + '?'", "repeated three times": "{} * 3",
            "followed by a dot": "{} + '.'", "followed by a space": "{} + ' '"},
           ("text('Hello World')", "text('  abC dE  ')", "text('x')", "text('')")),
    Family("apply", "medium", "apply(xs)", "takes a list of integers xs and returns each element {}, {}", "{second}",
           {"doubled": "v * 2", "squared": "v ** 2", "negated": "-v", "plus one": "v + 1", "minus one": "v - 1",
            "halved (integer division)": "v // 2", "tripled": "v * 3", "cubed": "v ** 3"},
           {"as a list": "[{} for v in xs]", "as a sorted list": "sorted({} for v in xs)",
            "as a reversed list": "[{} for v in xs][::-1]", "summed": "sum({} for v in xs)",
            "as a list sorted in descending order": "sorted(({} for v in xs), reverse=True)"},
           ("apply([3, -1, 4])", "apply([10, 5, -7, 2])", "apply([])", "apply([0])")),
    Family("compare", "hard", "compare(x, y)", "takes two integers x and y and returns True if x is {} {}, else False",
           "x {first} {second}", {"greater than": ">", "less than": "<", "equal to": "==", "at least": ">=",
                                   "at most": "<=", "different from": "!="},
           {"y": "y", "twice y": "2 * y", "y plus one": "y + 1", "the square of y": "y ** 2", "y minus one": "y - 1",
            "half of y (integer division)": "y // 2"},
           ("compare(3, 3)", "compare(5, 2)", "compare(2, 5)", "compare(4, 2)", "compare(9, 3)", "compare(-1, 0)",
            "compare(1, 0)")),
)


def generate_tasks() -> list[Task]:
    return [task for family in FAMILIES for task in _family_tasks(family)]


def combinations(family: Family) -> Iterator[tuple[str, str, str, str]]:
    """(first phrase, second phrase, prompt, reference solution) for every pair of phrases."""
    name = family.signature.split("(")[0]
    params = family.signature[len(name) + 1 : -1]
    for (first, first_code), (second, second_code) in itertools.product(family.first.items(), family.second.items()):
        # A second phrase with a hole wraps the first's code; otherwise both fill the family's code.
        body = (second_code.format(first_code) if "{}" in second_code
                else family.code.format(first=first_code, second=second_code))
        prompt = f"Write a Python function `{family.signature}` that {family.template.format(first, second)}."
        yield first, second, prompt, f"def {name}({params}):\n    return {body}\n"


def _family_tasks(family: Family) -> list[Task]:
    pairs = [(prompt, solution) for _, _, prompt, solution in combinations(family)]
    ids = [f"compose/{family.name}/{index:04d}" for index in range(len(pairs))]
    splits = hash_splits(ids, EVAL_FRACTION)
    entry_point = family.signature.split("(")[0]
    return [
        FunctionTask(id=task_id, prompt=prompt, entry_point=entry_point, reference_solution=solution,
                     tests=_hidden_tests(entry_point, solution, family.calls), difficulty=family.difficulty,
                     domain="python-functions", family=family.name, split=splits[task_id])
        for task_id, (prompt, solution) in zip(ids, pairs)
    ]


def _hidden_tests(entry_point: str, solution: str, calls: Sequence[str]) -> str:
    namespace: dict[str, object] = {}
    exec(solution, namespace)  # our own generated code, not model output
    cases = [f"\n\ndef test_case_{number}():\n    assert {call} == {eval(call, namespace)!r}\n"
             for number, call in enumerate(calls, start=1)]
    return f"from solution import {entry_point}\n" + "".join(cases)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    tasks = generate_tasks()
    write_jsonl(tasks, args.out)
    print(f"wrote {len(tasks)} tasks to {args.out}")


if __name__ == "__main__":
    main()
