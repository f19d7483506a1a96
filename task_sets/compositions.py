"""Generator for the built-in "compose" task set: functions described by a combination of phrases.

Each family fixes a function and three slots, each slot a closed list of phrases with the code
they mean ("the maximum of a and b" -> `max(a, b)`, "squared" -> `(...) ** 2`, "plus ten" ->
`... + 10`); a task is one combination, and its reference solution is the family's `build` of
the three phrases' code. Train and eval split the combinations, so every eval task is a
combination the policy never saw, made of phrases it has seen in others: solving it means
reading the slots of the prompt, not recalling a memorised answer. With ~850 combinations
memorising costs the model more than reading (a few combinations do not depend on every slot:
the count of the squares is the count of the elements), and nothing has to be copied token by
token out of the prompt (what the "default" set asks, and a small model trained from
scratch cannot yet do: see task_sets/generator.py). This is the set the default experiment
learns on.

Run `python -m task_sets.compositions` to rewrite `builtin/compose/generated.jsonl`.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from task_sets.generator import write_jsonl
from task_sets.schema import Difficulty, FunctionTask, Task
from task_sets.splits import hash_splits

EVAL_FRACTION = 0.065  # ~52 held-out tasks: enough for a pass rate to +-0.06, cheap to evaluate each iteration
DEFAULT_OUTPUT = Path(__file__).parent / "builtin" / "compose" / "generated.jsonl"


@dataclass(frozen=True)
class Family:
    """`signature`'s behaviour is `template` filled with one phrase of each slot; the code is
    `build` applied to the phrases' code; `calls` are the checks the hidden tests pin."""

    name: str
    difficulty: Difficulty
    signature: str
    template: str
    slots: tuple[dict[str, str], ...]
    build: Callable[..., str]
    calls: tuple[str, ...]


FILTERS = {"positive": "v > 0", "negative": "v < 0", "even": "v % 2 == 0", "odd": "v % 2 == 1", "nonzero": "v != 0",
           "larger than ten": "v > 10", "larger than five": "v > 5", "smaller than three": "v < 3"}
# Each list holds an element passing every filter, so max() and min() never see an empty list.
LISTS = ("[3, -4, 12, 7, -1, 0, 8]", "[-5, 2, 15, 9, -12, 4, 11, 0]", "[21, -3, 6, -8, 13, 1, 2]")

FAMILIES = (
    Family("combine", "easy", "combine(a, b)", "takes two integers a and b and returns the {} of a and b, {}, {}",
           ({"sum": "a + b", "difference": "a - b", "product": "a * b", "maximum": "max(a, b)",
             "minimum": "min(a, b)", "remainder": "a % b"},
            {"doubled": "({}) * 2", "tripled": "({}) * 3", "squared": "({}) ** 2", "negated": "-({})",
             "halved": "({}) // 2", "times ten": "({}) * 10"},
            {"plus one": " + 1", "minus one": " - 1", "plus two": " + 2", "minus two": " - 2", "plus ten": " + 10"}),
           lambda operation, scale, offset: scale.format(operation) + offset,
           ("combine(3, 5)", "combine(-2, 7)", "combine(4, 4)", "combine(0, -6)")),
    Family("pick", "medium", "pick(xs)", "takes a list of integers xs and returns the {} of the {} of its {} elements",
           ({"sum": "sum", "maximum": "max", "minimum": "min", "count": "len"},
            {"elements": "v", "squares": "v ** 2", "doubles": "v * 2", "negations": "-v", "halves": "v // 2"},
            FILTERS),
           lambda aggregate, value, condition: f"{aggregate}([{value} for v in xs if {condition}])",
           tuple(f"pick({xs})" for xs in LISTS)),
    Family("text", "easy", "text(s)", "takes a string s and returns s {}, repeated {}, followed by {}",
           ({"in upper case": "s.upper()", "in lower case": "s.lower()", "reversed": "s[::-1]",
             "without surrounding spaces": "s.strip()", "in title case": "s.title()",
             "with its case swapped": "s.swapcase()"},
            {"once": "", "twice": " * 2", "three times": " * 3"},
            {"an exclamation mark": " + '!'", "a question mark": " + '?'", "a dot": " + '.'", "a space": " + ' '"}),
           lambda case, repeat, tail: case + repeat + tail,
           ("text('Hello World')", "text('  abC dE  ')", "text('x')", "text('')")),
    Family("apply", "medium", "apply(xs)", "takes a list of integers xs and returns its {} elements {}, as {}",
           (FILTERS,
            {"doubled": "v * 2", "squared": "v ** 2", "negated": "-v", "plus one": "v + 1", "minus one": "v - 1",
             "halved": "v // 2", "tripled": "v * 3", "cubed": "v ** 3"},
            {"a list": "[{}]", "a sorted list": "sorted({})", "a reversed list": "[{}][::-1]", "a sum": "sum({})"}),
           lambda condition, value, shape: shape.format(f"{value} for v in xs if {condition}"),
           (*(f"apply({xs})" for xs in LISTS), "apply([])")),
    Family("compare", "hard", "compare(x, y)", "takes two integers x and y and returns True if {} is {} {}, else False",
           ({"x": "x", "twice x": "2 * x", "x plus one": "x + 1", "the square of x": "x ** 2", "x minus one": "x - 1"},
            {"greater than": ">", "less than": "<", "equal to": "==", "at least": ">=", "at most": "<=",
             "different from": "!="},
            {"y": "y", "twice y": "2 * y", "y plus one": "y + 1", "the square of y": "y ** 2", "y minus one": "y - 1",
             "half of y": "y // 2"}),
           lambda left, comparison, right: f"{left} {comparison} {right}",
           ("compare(3, 3)", "compare(5, 2)", "compare(2, 5)", "compare(4, 2)", "compare(9, 3)", "compare(-1, 0)",
            "compare(1, 0)", "compare(2, 4)")),
)


def generate_tasks() -> list[Task]:
    return [task for family in FAMILIES for task in _family_tasks(family)]


def combinations(family: Family) -> Iterator[tuple[tuple[str, ...], str, str]]:
    """(the phrases, prompt, reference solution) for every combination of one phrase per slot."""
    name = family.signature.split("(")[0]
    params = family.signature[len(name) + 1 : -1]
    for combination in itertools.product(*(slot.items() for slot in family.slots)):
        phrases = tuple(phrase for phrase, _ in combination)
        body = family.build(*(code for _, code in combination))
        prompt = f"Write a Python function `{family.signature}` that {family.template.format(*phrases)}."
        yield phrases, prompt, f"def {name}({params}):\n    return {body}\n"


def _family_tasks(family: Family) -> list[Task]:
    entry_point = family.signature.split("(")[0]
    triples = [(prompt, solution, hidden_tests(entry_point, solution, family.calls))
               for _, prompt, solution in combinations(family)]
    ids = [f"compose/{family.name}/{index:04d}" for index in range(len(triples))]
    # Combinations the tests cannot tell apart (sorted and reversed of a list the filter leaves
    # sorted) share a split: one's answer earns the other's reward (task_sets/separation.py).
    alike = {}
    for task_id, (_, _, tests) in zip(ids, triples):
        alike.setdefault(tests, task_id)
    splits = hash_splits(sorted(set(alike.values())), EVAL_FRACTION)
    return [
        FunctionTask(id=task_id, prompt=prompt, entry_point=entry_point, reference_solution=solution, tests=tests,
                     difficulty=family.difficulty, domain="python-functions", family=family.name,
                     split=splits[alike[tests]])
        for task_id, (prompt, solution, tests) in zip(ids, triples)
    ]


def hidden_tests(entry_point: str, solution: str, calls: Sequence[str]) -> str:
    cases = [f"\n\ndef test_case_{number}():\n    assert {call} == {call_value(solution, call)!r}\n"
             for number, call in enumerate(calls, start=1)]
    return f"from solution import {entry_point}\n" + "".join(cases)


def call_value(solution: str, call: str) -> object:
    """What `call` returns with `solution` defined: our own generated code, not model output."""
    namespace: dict[str, object] = {}
    exec(solution, namespace)
    return eval(call, namespace)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    tasks = generate_tasks()
    write_jsonl(tasks, args.out)
    print(f"wrote {len(tasks)} tasks to {args.out}")


if __name__ == "__main__":
    main()
