"""Generator for the built-in "repair" task set: fix a function whose spec only its tests know.

Each task is one combination of a compose family's phrases (task_sets/compositions.py), hidden
this time: the prompt names the function and says it fails its tests, nothing more. The
workspace holds `solution.py`, the function with a defect (one slot of another phrase), and
`check.py`, the visible tests, which print the first call that failed, what it expected and what
it got, and the behaviour the tests expect in words. So the information needed to succeed is
only available by running something: a policy that never reads an observation can only guess
among the family's combinations (1 in 150 or more), and one that reads it writes the fix the way
compose's policy writes a function from its prompt.

A good episode runs the check, reads it, writes the fixed solution.py and submits
(training/sft/demonstrations.py shows it that way). The hidden tests call the function
on the visible cases and more. Train and eval split the combinations as compose does, so every
held-out task is a combination no train task shows; difficulty is the family's, as in compose
(measured there: the hard family is solved least).

Run `python -m task_sets.repairs` to rewrite `builtin/repair/generated.jsonl`.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Sequence
from pathlib import Path

from task_sets.compositions import FAMILIES, Family, call_value, combinations, hidden_tests
from task_sets.generator import write_jsonl
from task_sets.schema import SOLUTION_FILE, FunctionTask, Task
from task_sets.splits import hash_splits

EVAL_FRACTION = 0.065  # ~56 held-out tasks
VISIBLE_CASES = 2  # the calls check.py makes; the hidden tests make all of the family's
CHECK_FILE = "check.py"
CHECK_COMMAND = f"python3 {CHECK_FILE}"
DEFAULT_OUTPUT = Path(__file__).parent / "builtin" / "repair" / "generated.jsonl"

# The visible tests: stop at the first failing call, so the observation stays a few lines long.
CHECK_TEMPLATE = '''"""The visible tests of {signature}: run `{command}`."""
from solution import {name}

EXPECTED = {spec!r}
CASES = {cases!r}

for call, want in CASES:
    try:
        got = eval(call)
    except Exception as error:
        got = error
    if got != want:
        print(f"FAIL {{call}}: expected {{want!r}}, got {{got!r}}")
        print(f"want: {{EXPECTED}}")
        raise SystemExit(1)
print(f"all {{len(CASES)}} checks passed")
'''


def generate_tasks() -> list[Task]:
    return [task for family in FAMILIES for task in _family_tasks(family)]


def _family_tasks(family: Family) -> list[Task]:
    name = family.signature.split("(")[0]
    combos = list(combinations(family))
    ids = [f"repair/{family.name}/{index:04d}" for index in range(len(combos))]
    splits = hash_splits(ids, EVAL_FRACTION)
    solutions = {phrases: solution for phrases, _, solution in combos}
    tasks = []
    for task_id, (phrases, _, solution) in zip(ids, combos):
        spec = f"{family.signature} {family.template.format(*phrases)}"
        visible = family.calls[:VISIBLE_CASES]
        cases = tuple((call, call_value(solution, call)) for call in visible)
        defective = _defect(task_id, phrases, solutions, cases)
        check = CHECK_TEMPLATE.format(signature=family.signature, command=CHECK_COMMAND, name=name, spec=spec,
                                      cases=cases)
        tasks.append(FunctionTask(
            id=task_id, prompt=f"`{family.signature}` in {SOLUTION_FILE} fails `{CHECK_COMMAND}`: fix it, then submit.",
            files={SOLUTION_FILE: defective, CHECK_FILE: check}, check_command=CHECK_COMMAND, entry_point=name,
            reference_solution=solution, tests=hidden_tests(name, solution, family.calls),
            difficulty=family.difficulty, domain="python-repair", family=family.name, split=splits[task_id]))
    return tasks


def _defect(task_id: str, phrases: tuple[str, ...], solutions: dict[tuple[str, ...], str],
            cases: tuple[tuple[str, object], ...]) -> str:
    """The starting solution.py: the combination that differs in one slot and fails a visible
    case, chosen by the task id's hash (stable across runs and machines)."""
    candidates = [other for other in solutions
                  if sum(a != b for a, b in zip(other, phrases)) == 1
                  and any(call_value(solutions[other], call) != want for call, want in cases)]
    if not candidates:
        raise ValueError(f"{task_id}: no one-slot defect fails a visible case")
    digest = int(hashlib.sha256(task_id.encode()).hexdigest(), 16)
    return solutions[candidates[digest % len(candidates)]]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    tasks = generate_tasks()
    write_jsonl(tasks, args.out, extra_fields=("files", "check_command"))
    print(f"wrote {len(tasks)} tasks to {args.out}")


if __name__ == "__main__":
    main()
