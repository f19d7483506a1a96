"""The one line `crucible run` says when `dagster job launch` fails (pipelines/run_submission.py)."""

from __future__ import annotations

import pytest

from pipelines.run_submission import _why

pytestmark = pytest.mark.unit

# The end of what `dagster job launch` printed when its code server had died (trimmed).
UNREACHABLE = '''\
  File ".venv/lib/python3.11/site-packages/dagster/_grpc/client.py", line 195, in _raise_grpc_exception
    raise DagsterUserCodeUnreachableError(

The above exception was caused by the following exception:
grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with:
	status = StatusCode.UNAVAILABLE
	details = "failed to connect to all addresses; last error: unix:/tmp/crucible-0035969e-n3qx8hma/code.sock: Connection refused"
	debug_error_string = "UNAVAILABLE:failed to connect to all addresses"
>

Stack Trace:
  File ".venv/lib/python3.11/site-packages/grpc/_channel.py", line 999, in _end_unary_response_blocking
    raise _InactiveRpcError(state)  # pytype: disable=not-instantiable
    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
'''


def test_a_grpc_failure_is_told_with_its_status_and_what_failed():
    assert _why(UNREACHABLE) == (
        "grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that terminated with: "
        "status = StatusCode.UNAVAILABLE details = \"failed to connect to all addresses; last error: "
        "unix:/tmp/crucible-0035969e-n3qx8hma/code.sock: Connection refused\"")


def test_an_exception_is_told_by_its_own_line_not_the_markers_under_it():
    assert _why("Traceback (most recent call last):\n  x()\n  ^^^\nValueError: no such job\n") == "ValueError: no such job"


def test_output_without_an_exception_is_told_by_its_last_line():
    assert _why("loading\nno job named 'x' in the workspace\n  ^^^^\n") == "no job named 'x' in the workspace"
