"""The test harness run inside the sandbox (stdlib only); the grader imports its `test_names`."""
