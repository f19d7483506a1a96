"""Seeded generator for the built-in "default" task set.

The policy is a tiny model trained from scratch, so the set holds many instances
of a few task families: solving a new instance means copying constants from the prompt into
a code shape the family never changes. Each family keeps one function name (`add`, `scale`,
…): copying an arbitrary identifier out of the prompt is beyond a 3M-parameter model after a
few minutes of warm-up (measured with a byte-level vocabulary: 0 of 40 after 1,200 steps), and
a wrong name fails every test, which would leave reinforcement learning with no reward to work
from.

Run `python -m task_sets.generator` to rewrite `builtin/default/generated.jsonl`; the same
seed always gives a byte-identical file.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from task_sets.schema import Difficulty, FunctionTask, Task
from task_sets.splits import hash_splits

DEFAULT_SEED = 0
INSTANCES_PER_FAMILY = 20
EVAL_FRACTION = 0.2
DEFAULT_OUTPUT = Path(__file__).parent / "builtin" / "default" / "generated.jsonl"
# Only what differs from the schema defaults, plus the domain, is written to the file.
_WRITTEN_FIELDS = {
    "id", "prompt", "entry_point", "reference_solution", "tests", "difficulty", "domain", "family", "split",
}  # fmt: skip

_WORDS = (
    "apple", "banana", "cherry", "violet", "silver", "tiger", "falcon", "river", "meadow",
    "planet", "rocket", "garden", "yellow", "orange", "purple", "castle", "dragon", "forest",
    "harbor", "island", "jungle", "lemon", "mango", "pepper", "ribbon", "saddle", "tunnel",
    "velvet", "walnut", "zephyr",
)  # fmt: skip


@dataclass(frozen=True)
class Instance:
    """One generated problem; `checks` are expressions whose values the hidden tests pin."""

    entry_point: str
    prompt: str
    reference_solution: str
    checks: tuple[str, ...]


# --- helpers shared by the families -------------------------------------------------------


def _prompt(signature: str, behaviour: str) -> str:
    return f"Write a Python function `{signature}` that {behaviour}."


def _one_liner(name: str, params: str, expression: str) -> str:
    return f"def {name}({params}):\n    return {expression}\n"


def _calls(name: str, arguments: Sequence[object]) -> tuple[str, ...]:
    return tuple(f"{name}({argument!r})" for argument in arguments)


def _int_list(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(3, 6))]


# --- easy: one operation with one constant --------------------------------------------------


def _add_k(rng: random.Random) -> Instance:
    k = rng.randint(2, 40)
    name = "add"
    return Instance(
        name,
        _prompt(f"{name}(x)", f"takes an integer x and returns x plus {k}"),
        _one_liner(name, "x", f"x + {k}"),
        _calls(name, rng.sample(range(-20, 60), 4)),
    )


def _scale_k(rng: random.Random) -> Instance:
    k = rng.randint(2, 30)
    name = "scale"
    # x = 0 passes for any factor: a near-miss constant still earns partial credit.
    inputs = [0, *rng.sample([x for x in range(-15, 30) if x != 0], 3)]
    return Instance(
        name,
        _prompt(f"{name}(x)", f"takes an integer x and returns x multiplied by {k}"),
        _one_liner(name, "x", f"x * {k}"),
        _calls(name, inputs),
    )


def _const_str(rng: random.Random) -> Instance:
    word = rng.choice(_WORDS)
    name = "word"
    # Length and end letters give a near-miss spelling partial credit.
    call = f"{name}()"
    return Instance(
        name,
        _prompt(f"{name}()", f"takes no arguments and returns the string '{word}'"),
        _one_liner(name, "", repr(word)),
        (call, f"len({call})", f"{call}[0]", f"{call}[-1]"),
    )


# --- medium: a library call or two constants ------------------------


def _affine(rng: random.Random) -> Instance:
    a, b = rng.randint(2, 9), rng.randint(1, 20)
    name = "affine"
    inputs = [0, 1, *rng.sample(range(2, 25), 2)]
    return Instance(
        name,
        _prompt(f"{name}(x)", f"takes an integer x and returns {a} * x + {b}"),
        _one_liner(name, "x", f"{a} * x + {b}"),
        _calls(name, inputs),
    )


def _repeat_str(rng: random.Random) -> Instance:
    k = rng.randint(2, 30)
    name = "repeat"
    words = ["".join(rng.choices("abcxyz", k=rng.randint(1, 3))) for _ in range(3)]
    return Instance(
        name,
        _prompt(f"{name}(s)", f"takes a string s and returns s repeated {k} times"),
        _one_liner(name, "s", f"s * {k}"),
        _calls(name, ["", *words]),
    )


def _max_plus(rng: random.Random) -> Instance:
    k = rng.randint(1, 20)
    name = "max_plus"
    lists = [_int_list(rng, -30, 30), _int_list(rng, -30, 30), _int_list(rng, -30, -1), [rng.randint(-9, 9)]]
    return Instance(
        name,
        _prompt(f"{name}(xs)", f"takes a non-empty list of integers xs and returns its maximum plus {k}"),
        _one_liner(name, "xs", f"max(xs) + {k}"),
        _calls(name, lists),
    )


def _count_char(rng: random.Random) -> Instance:
    char = rng.choice(string.ascii_lowercase)
    others = rng.sample([c for c in string.ascii_lowercase if c != char], 3)
    name = "count_char"

    def text_with(occurrences: int) -> str:
        letters = [char] * occurrences + rng.choices(others, k=rng.randint(3, 7))
        rng.shuffle(letters)
        return "".join(letters)

    return Instance(
        name,
        _prompt(f"{name}(s)", f"takes a string s and returns how many times the character '{char}' is in s"),
        _one_liner(name, "s", f"s.count({char!r})"),
        _calls(name, [text_with(count) for count in (0, 1, rng.randint(2, 3), rng.randint(4, 5))]),
    )


# --- hard: a condition or a loop ------------------------------------------


def _threshold_negate(rng: random.Random) -> Instance:
    k = rng.randint(1, 20)
    name = "threshold"
    # Inputs around the threshold: a near-miss threshold fails only the boundary cases.
    inputs = [k + 1, k, k - rng.randint(1, 3), k + rng.randint(4, 15), -rng.randint(1, 9)]
    return Instance(
        name,
        _prompt(f"{name}(x)", f"takes an integer x and returns x if x is greater than {k}, else -x"),
        _one_liner(name, "x", f"x if x > {k} else -x"),
        _calls(name, inputs),
    )


def _sum_multiples(rng: random.Random) -> Instance:
    k = rng.randint(2, 30)
    name = "sum_multiples"
    inputs = [k, k + 1, 3 * k + rng.randint(1, k - 1), rng.randint(20, 60)]
    return Instance(
        name,
        _prompt(f"{name}(n)", f"takes an integer n >= 0 and returns the sum of the multiples of {k} below n"),
        f"def {name}(n):\n    total = 0\n    for i in range(0, n, {k}):\n"
        "        total += i\n    return total\n",
        _calls(name, inputs),
    )


def _filter_above(rng: random.Random) -> Instance:
    k = rng.randint(0, 20)
    name = "filter_above"
    lists = [[], _int_list(rng, k - 10, k + 10), _int_list(rng, k - 10, k + 10), [k - 1, k, k + 1]]
    behaviour = f"takes a list of integers xs and returns a list of its elements greater than {k}, in order"
    return Instance(
        name,
        _prompt(f"{name}(xs)", behaviour),
        _one_liner(name, "xs", f"[v for v in xs if v > {k}]"),
        _calls(name, lists),
    )


FAMILIES: dict[str, tuple[Difficulty, Callable[[random.Random], Instance]]] = {
    "add_k": ("easy", _add_k),
    "scale_k": ("easy", _scale_k),
    "const_str": ("easy", _const_str),
    "affine": ("medium", _affine),
    "repeat_str": ("medium", _repeat_str),
    "max_plus": ("medium", _max_plus),
    "count_char": ("medium", _count_char),
    "threshold_negate": ("hard", _threshold_negate),
    "sum_multiples": ("hard", _sum_multiples),
    "filter_above": ("hard", _filter_above),
}


# --- assembling tasks ---------------------------------------------------------------------


def generate_tasks(seed: int = DEFAULT_SEED) -> list[Task]:
    return [task for family in FAMILIES for task in _family_tasks(family, seed)]


def _family_tasks(family: str, seed: int) -> list[Task]:
    difficulty, make_instance = FAMILIES[family]
    # One stream per family, so adding or changing a family leaves the others' instances alone.
    rng = random.Random(f"{seed}/{family}")
    instances: dict[str, Instance] = {}
    for _ in range(100 * INSTANCES_PER_FAMILY):
        instance = make_instance(rng)
        instances.setdefault(instance.reference_solution, instance)
        if len(instances) == INSTANCES_PER_FAMILY:
            break
    else:
        raise ValueError(f"family {family}: only {len(instances)} distinct instances exist")
    ids = [f"default/{family}/{index:04d}" for index in range(INSTANCES_PER_FAMILY)]
    splits = hash_splits(ids, EVAL_FRACTION)
    return [
        FunctionTask(
            id=task_id,
            prompt=instance.prompt,
            entry_point=instance.entry_point,
            reference_solution=instance.reference_solution,
            tests=_hidden_tests(instance),
            difficulty=difficulty,
            domain="python-functions",
            family=family,
            split=splits[task_id],
        )
        for task_id, instance in zip(ids, instances.values())
    ]


def _hidden_tests(instance: Instance) -> str:
    """One test function per check, its expected value computed by the reference solution."""
    namespace: dict[str, object] = {}
    exec(instance.reference_solution, namespace)  # our own generated code, not model output
    cases = [
        f"\n\ndef test_case_{number}():\n    assert {check} == {eval(check, namespace)!r}\n"
        for number, check in enumerate(instance.checks, start=1)
    ]
    return f"from solution import {instance.entry_point}\n" + "".join(cases)


def write_jsonl(tasks: Sequence[Task], path: Path, extra_fields: Sequence[str] = ()) -> None:
    """One task per line: the fields every generated set sets, and `extra_fields`."""
    fields = _WRITTEN_FIELDS | set(extra_fields)
    lines = [json.dumps(task.model_dump(mode="json", include=fields)) + "\n" for task in tasks]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as out:
        out.writelines(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    tasks = generate_tasks(args.seed)
    write_jsonl(tasks, args.out)
    print(f"wrote {len(tasks)} tasks to {args.out}")


if __name__ == "__main__":
    main()
