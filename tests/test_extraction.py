"""How a reply becomes the solution it submits (training/agent/extraction.py): each rule on the
shapes real models write, then a corpus of replies a real model wrote (tests/data/replies/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.agent.extraction import ExtractionMethod, extract_solution

pytestmark = pytest.mark.unit
REPLIES = Path(__file__).parent / "data" / "replies"


def test_a_fenced_block_between_prose_is_its_body():
    reply = "Here is the function:\n\n```python\ndef f(x):\n    return x\n```\n\nIt returns x, doesn't it?"
    extraction = extract_solution(reply)
    assert (extraction.code, extraction.method) == ("def f(x):\n    return x\n", ExtractionMethod.FENCED)


def test_a_lone_closing_fence_after_code_ends_the_solution_and_the_prose_after_it_is_left_out():
    reply = "def f(x):\n    return x + 1\n```\n\nThis function adds one, so it's simple."
    extraction = extract_solution(reply)
    assert extraction.code == "def f(x):\n    return x + 1\n"
    assert extraction.method == ExtractionMethod.BEFORE_CLOSING_FENCE


def test_a_body_only_completion_before_a_closing_fence_counts_as_code():
    reply = "    return sorted(numbers)[0]\n```\nThe smallest number comes first."
    assert extract_solution(reply).code == "    return sorted(numbers)[0]\n"


def test_prose_before_an_untagged_fence_opens_the_block():
    reply = "Sure\n```\ndef f():\n    return 1\n```\n"
    extraction = extract_solution(reply)
    assert (extraction.code, extraction.method) == ("def f():\n    return 1\n", ExtractionMethod.FENCED)


def test_the_block_defining_the_entry_point_wins_over_a_usage_example_before_it():
    reply = ("Usage:\n```python\nprint(add(1, 2))\n```\nImplementation:\n```python\ndef add(a, b):\n"
             "    return a + b\n```\n")
    extraction = extract_solution(reply, entry_point="add")
    assert extraction.code == "def add(a, b):\n    return a + b\n"
    assert extraction.detail == "block 2 of 2 (python)"


def test_without_an_entry_point_the_first_block_that_defines_something_wins():
    reply = "```python\nx = f(2)\n```\n```python\ndef f(n):\n    return n\n```\n```python\ndef g():\n    pass\n```"
    assert extract_solution(reply).code == "def f(n):\n    return n\n"


def test_a_block_in_another_language_is_passed_over_for_python():
    reply = "```bash\npython3 solution.py\n```\n```py\ndef main():\n    pass\n```"
    assert extract_solution(reply).code == "def main():\n    pass\n"


def test_a_fence_never_closed_runs_to_the_end_of_the_reply():
    extraction = extract_solution("Here:\n```python\ndef g():\n    pass\n")
    assert (extraction.code, extraction.method) == ("def g():\n    pass\n", ExtractionMethod.UNCLOSED_FENCE)


def test_a_fence_inside_a_longer_fence_does_not_close_it():
    reply = "````markdown\n```python\nx = 1\n```\n````\n"
    assert extract_solution(reply).code == "```python\nx = 1\n```\n"


def test_a_reply_without_fences_is_submitted_as_it_is():
    extraction = extract_solution("def h():\n    return 2\n")
    assert (extraction.code, extraction.method) == ("def h():\n    return 2\n", ExtractionMethod.WHOLE_REPLY)


@pytest.mark.parametrize(("reply", "detail"), [("", "the reply is empty"), ("  \n", "the reply is empty"),
                                               ("Here:\n```python\n```\n", "block 1 of 1 (python) is empty")])
def test_an_empty_reply_or_block_says_why_nothing_was_submitted(reply, detail):
    extraction = extract_solution(reply)
    assert (extraction.code, extraction.method, extraction.detail) == ("", ExtractionMethod.EMPTY, detail)


def test_broken_code_before_a_lone_closing_fence_is_still_the_solution():
    """SmolLM2 on HumanEval/10: a def without a body, then the fence that closes it, then prose.
    It does not parse, but prose never opens with a definition: the fence closes code."""
    reply = ("def is_palindrome(string: str) -> bool:\n    return string == string[::-1]\n\n"
             "def is_palindrome_little_endian() -> bool:\n```\n\nThis implementation uses bytes.\n")
    extraction = extract_solution(reply, "is_palindrome")
    assert extraction.method is ExtractionMethod.BEFORE_CLOSING_FENCE
    assert extraction.code.startswith("def is_palindrome(") and "This implementation" not in extraction.code
