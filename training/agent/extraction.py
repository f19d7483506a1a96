"""From a reply, as real models write it, to the solution.py it submits.

Instruct models wrap code in markdown fences with prose before and after, follow it with a
usage example in a second block, continue a block the prompt seemed to open (code, then a lone
closing fence, then an explanation), or are cut at their token budget inside a block. Fences
are read as CommonMark reads them, line by line: an opening fence is three or more backticks
(or tildes) and an optional info string; a block is closed only by a bare fence line of the
same character, at least as long. Which code is submitted (`Extraction`):

1. A reply whose first fence line is bare and follows code continued a block: the code before
   that fence (the lone fence closes it; what follows is prose).
2. Otherwise, among the fenced blocks tagged Python or untagged: the first that defines the
   task's entry point, else the first that defines a function or class, else the first; blocks
   in another language only where there is no such block. A block left open runs to the end.
3. No fence: the reply as it is (grading reports a syntax error in prose as such).

Nothing is judged here beyond choosing the text: a wrong answer reaches the grader as written.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass

from statuses import ClosedSet

_CODE_OPENING = re.compile(r"^(?:(?:async\s+)?def\s+\w+\s*\(|class\s+\w+\s*[(:]|import\s+\w|from\s+[\w.]+\s+import\s|@\w)")
_FENCE_LINE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)$")
_PYTHON_TAGS = {"", "python", "py", "python3", "py3", "pycon", "ipython"}


class ExtractionMethod(ClosedSet):
    """How a reply's submission was taken from it (the single turn's `detail` says which block)."""

    FENCED = "fenced", "the body of a closed fenced block"
    UNCLOSED_FENCE = "unclosed_fence", "the body of a fenced block the reply never closed (cut at its budget)"
    BEFORE_CLOSING_FENCE = "before_closing_fence", ("the reply continued a code block: the code before its lone "
                                                    "closing fence, prose after it left out")
    WHOLE_REPLY = "whole_reply", "no fence: the reply as it is"
    EMPTY = "empty", "nothing to submit: the reply, or the only code block it has, is empty"


@dataclass(frozen=True)
class Extraction:
    code: str
    method: ExtractionMethod
    detail: str  # which block, or why nothing was found: one line for the trajectory

    @property
    def note(self) -> str:
        return f"{self.method.value}: {self.detail}" if self.detail else self.method.value


@dataclass(frozen=True)
class _Block:
    info: str  # the info string's first word, lower-cased ("" when untagged)
    body: str
    closed: bool


def extract_solution(reply: str, entry_point: str | None = None) -> Extraction:
    """The solution.py a reply submits (its text before the end-of-turn token), and how it was
    found; `entry_point` is the function the task's tests call, where it has one."""
    if not reply.strip():
        return Extraction("", ExtractionMethod.EMPTY, "the reply is empty")
    lines = reply.splitlines(keepends=True)
    fences = [i for i, line in enumerate(lines) if _FENCE_LINE.match(line.rstrip("\r\n"))]
    if not fences:
        return Extraction(reply, ExtractionMethod.WHOLE_REPLY, "")
    before = "".join(lines[: fences[0]])
    if not _info(lines[fences[0]]) and (_is_code(before) or _opens_like_code(before)):
        return Extraction(before, ExtractionMethod.BEFORE_CLOSING_FENCE, f"{len(lines[: fences[0]])} lines of code")
    blocks = _blocks(lines)
    chosen = _choose(blocks, entry_point)
    block = blocks[chosen]
    where = f"block {chosen + 1} of {len(blocks)}" + (f" ({block.info})" if block.info else "")
    if not block.body.strip():
        return Extraction("", ExtractionMethod.EMPTY, f"{where} is empty")
    method = ExtractionMethod.FENCED if block.closed else ExtractionMethod.UNCLOSED_FENCE
    return Extraction(block.body, method, where)


def _info(line: str) -> str:
    match = _FENCE_LINE.match(line.rstrip("\r\n"))
    words = match.group("info").strip().split() if match else []
    return words[0].lower() if words else ""


def _blocks(lines: list[str]) -> list[_Block]:
    """The reply's fenced blocks, CommonMark's way: a block closes at a bare fence line of its
    own character, at least as long as the one that opened it."""
    blocks: list[_Block] = []
    opened: tuple[str, str, int] | None = None  # fence, info, first body line
    for i, line in enumerate(lines):
        match = _FENCE_LINE.match(line.rstrip("\r\n"))
        if match is None:
            continue
        fence, info = match.group("fence"), match.group("info").strip()
        if opened is None:
            opened = (fence, _info(line), i + 1)
        elif not info and fence[0] == opened[0][0] and len(fence) >= len(opened[0]):
            blocks.append(_Block(opened[1], "".join(lines[opened[2] : i]), closed=True))
            opened = None
    if opened is not None:
        blocks.append(_Block(opened[1], "".join(lines[opened[2] :]), closed=False))
    return blocks


def _choose(blocks: list[_Block], entry_point: str | None) -> int:
    """The index of the block to submit (rule 2 of the module's docstring)."""
    python = [i for i, block in enumerate(blocks) if block.info in _PYTHON_TAGS] or list(range(len(blocks)))
    definitions = {i: _definitions(blocks[i].body) for i in python}
    for wanted in ([entry_point] if entry_point else []):
        found = [i for i in python if wanted in definitions[i]]
        if found:
            return found[0]
    return next((i for i in python if definitions[i]), python[0])


def _definitions(code: str) -> set[str]:
    """Names of the functions and classes `code` defines at its top level (none if it does not parse)."""
    try:
        tree = ast.parse(textwrap.dedent(code))
    except (SyntaxError, ValueError):
        return set()
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _opens_like_code(text: str) -> bool:
    """Whether `text` begins as only code does (a definition, an import, a decorator): real models
    write broken code before a lone closing fence as often as working code (SmolLM2's unbalanced
    brackets, a def without a body), and prose never begins with these."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return _CODE_OPENING.match(first) is not None


def _is_code(text: str) -> bool:
    """Whether `text` parses as Python statements, alone or as a function's body (a completion
    that writes only the body), with at least one that is more than a bare name or constant
    (which is what a line of prose would parse as, if it parsed at all)."""
    if not text.strip():
        return False
    dedented = textwrap.dedent(text)
    for source in (dedented, "def _():\n" + textwrap.indent(dedented, "    ")):
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        body = tree.body[0].body if source is not dedented else tree.body
        return any(not (isinstance(node, ast.Expr) and isinstance(node.value, (ast.Name, ast.Constant)))
                   for node in body)
    return False
