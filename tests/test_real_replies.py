"""Solutions extracted from a real model's replies: SmolLM2-135M-Instruct's answers to the first
16 HumanEval and MBPP problems as Crucible prompts them (greedy and sampled), recorded by
scripts/record-replies and reviewed. Each pins the extraction a reviewer checked, so a change to
training/agent/extraction.py that reads a real answer differently fails here with its task."""

from __future__ import annotations

import ast
import json
from collections import Counter
from pathlib import Path

import pytest

from training.agent.extraction import ExtractionMethod, extract_solution

pytestmark = pytest.mark.unit

RECORDED = Path(__file__).parent / "data" / "replies" / "smollm2-135m-instruct.jsonl"
REPLIES = [json.loads(line) for line in RECORDED.read_text().splitlines()]


def _name(reply: dict) -> str:
    return f"{reply['task_id']}@{reply['temperature']}#{REPLIES.index(reply)}"


@pytest.mark.parametrize("reply", REPLIES, ids=_name)
def test_a_recorded_reply_extracts_as_reviewed(reply):
    extraction = extract_solution(reply["reply"], reply["entry_point"])
    assert (extraction.method.value, extraction.code) == (reply["method"], reply["code"])


def test_no_extracted_solution_keeps_a_fence_line():
    """What CommonMark closes is never graded as code (issue 38: a closing fence read as an
    opening one sent the prose after the code to the grader)."""
    for reply in REPLIES:
        assert not any(line.lstrip().startswith("```") for line in reply["code"].splitlines()), _name(reply)


def test_the_corpus_covers_the_shapes_real_answers_take():
    methods = Counter(reply["method"] for reply in REPLIES)
    shapes = {ExtractionMethod.FENCED, ExtractionMethod.UNCLOSED_FENCE, ExtractionMethod.BEFORE_CLOSING_FENCE,
              ExtractionMethod.WHOLE_REPLY}
    assert all(methods[shape.value] >= 5 for shape in shapes), methods
    assert len({reply["task_id"] for reply in REPLIES}) == 32


def test_a_fenced_answer_that_defines_the_entry_point_is_the_block_graded():
    """Among several blocks (the code, then a usage example), the one defining the function."""
    for reply in REPLIES:
        defines = [block for block in _python_blocks(reply["reply"]) if _defines(block, reply["entry_point"])]
        if reply["method"] == ExtractionMethod.FENCED.value and defines:
            assert _defines(reply["code"], reply["entry_point"]), _name(reply)


def _python_blocks(text: str) -> list[str]:
    blocks, current = [], None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _defines(code: str, name: str) -> bool:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return f"def {name}(" in code
    return any(isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name for node in ast.walk(tree))
