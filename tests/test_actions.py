"""The action format: every action parses, and every malformed reply says what is wrong."""

from __future__ import annotations

import pytest

from training.agent.actions import Malformed, Replace, Run, Submit, Write, parse_action


@pytest.mark.parametrize(("reply", "action"), [
    ("Let me look.\n<run>python3 -m pytest -q tests</run>", Run("python3 -m pytest -q tests")),
    ('<write path="a/b.py">\ndef f():\n    return 1\n</write>', Write("a/b.py", "def f():\n    return 1\n")),
    ('<write path="x.txt"></write>', Write("x.txt", "")),
    ('<replace path="m.py"><old>a / b</old><new>a // b</new></replace>', Replace("m.py", "a / b", "a // b")),
    ('<replace path="m.py">\n<old>x = 1\n</old>\n<new></new>\n</replace>', Replace("m.py", "x = 1\n", "")),
    ("All done.\n<submit/>", Submit()),
    ("<submit></submit>", Submit()),
    ("<run>ls</run> then <submit/>", Run("ls")),  # the first action only
    ("<run>echo '<write path=\"x\">'</run>", Run("echo '<write path=\"x\">'")),
])
def test_actions_parse(reply, action):
    assert parse_action(reply) == action


@pytest.mark.parametrize(("reply", "reason"), [
    ("I think the bug is in money.py.", "no action found"),
    ("<run>pytest", "<run> is not closed"),
    ("<run>   </run>", "<run> is empty"),
    ("<write>x</write>", 'a path="FILE" attribute is needed'),
    ('<write path="/etc/passwd">x</write>', "'/etc/passwd' is not a file path inside the workspace"),
    ('<write path="../up.py">x</write>', "'../up.py' is not a file path inside the workspace"),
    ('<replace path="m.py">a / b</replace>', "<replace> needs <old>TEXT</old><new>TEXT</new> inside"),
    ('<replace path="m.py"><old></old><new>x</new></replace>', "<old> is empty"),
    ("<delete path=\"m.py\"/>", "no action found"),
])
def test_malformed_replies_say_what_is_wrong(reply, reason):
    action = parse_action(reply)
    assert isinstance(action, Malformed) and reason in action.reason and "Actions (one per turn)" in action.reason
