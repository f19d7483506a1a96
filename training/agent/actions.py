"""The action format a policy writes in a multi-turn episode, and its parser.

One action per turn, anywhere in the reply (text around it is the model's own notes):

    <run>python3 -m pytest -q tests</run>
    <write path="shopcart/money.py">
    ...the whole new file...
    </write>
    <replace path="shopcart/money.py"><old>return a / b</old><new>return a // b</new></replace>
    <submit/>

`write` replaces a file (one newline right after the opening tag is dropped, so the content can
start on its own line); `replace` swaps exactly one occurrence of `old` for `new`; `submit`
ends the episode and hands the workspace to the grader. Paths are relative to the workspace.
Parsing never raises: a reply with no action, an unknown tag, a missing attribute or a bad
path becomes `Malformed` with a reason the policy reads as its next observation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

USAGE = ('Actions (one per turn): <run>COMMAND</run> | <write path="FILE">CONTENT</write> | '
         '<replace path="FILE"><old>TEXT</old><new>TEXT</new></replace> | <submit/>')
_ACTION = re.compile(
    r"<(?P<tag>run|write|replace)(?P<attrs>(?:\s+[a-z]+=\"[^\"]*\")*)\s*>(?P<body>.*?)</(?P=tag)>"
    r"|<submit\s*/>|<submit>\s*</submit>",
    re.DOTALL,
)
_OPENING = re.compile(r"<(run|write|replace|submit)\b")
_ATTRIBUTE = re.compile(r'([a-z]+)="([^"]*)"')
_OLD_NEW = re.compile(r"\A\s*<old>(?P<old>.*?)</old>\s*<new>(?P<new>.*?)</new>\s*\Z", re.DOTALL)


@dataclass(frozen=True)
class Run:
    command: str


@dataclass(frozen=True)
class Write:
    path: str
    content: str


@dataclass(frozen=True)
class Replace:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Submit:
    """Hand the workspace to the grader; the episode ends."""


@dataclass(frozen=True)
class Malformed:
    reason: str


Action = Run | Write | Replace | Submit | Malformed


def parse_action(reply: str) -> Action:
    """The first action in `reply`, or Malformed saying what is wrong."""
    match = _ACTION.search(reply)
    if match is None:
        opened = _OPENING.search(reply)
        if opened:
            return Malformed(f"<{opened.group(1)}> is not closed or not well-formed. {USAGE}")
        return Malformed(f"no action found. {USAGE}")
    if match.group("tag") is None:
        return Submit()
    tag, body = match.group("tag"), match.group("body")
    attributes = dict(_ATTRIBUTE.findall(match.group("attrs") or ""))
    if tag == "run":
        return Run(body.strip()) if body.strip() else Malformed(f"<run> is empty. {USAGE}")
    path = attributes.get("path")
    problem = _path_problem(path)
    if problem:
        return Malformed(f"<{tag}>: {problem}. {USAGE}")
    if tag == "write":
        return Write(path, body.removeprefix("\n"))
    pair = _OLD_NEW.match(body)
    if pair is None:
        return Malformed(f"<replace> needs <old>TEXT</old><new>TEXT</new> inside. {USAGE}")
    if not pair.group("old"):
        return Malformed(f"<replace>: <old> is empty. {USAGE}")
    return Replace(path, pair.group("old"), pair.group("new"))


def _path_problem(path: str | None) -> str | None:
    if not path:
        return 'a path="FILE" attribute is needed'
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or path.endswith("/"):
        return f"{path!r} is not a file path inside the workspace"
    return None
