"""The closed status sets: every status a sandbox run or a grading can end in, as stored.

Status names are data (stored in Parquet, written by `crucible verify`, matched in SQL), so each
set is closed: a value outside it is a bug, refused where a row is written (datastore/schema.py),
and each value is documented where it is defined, which docs/schema.md is generated from. A leaf:
the sandbox, grading and the datastore all import it, and it imports nothing of theirs.
"""

from __future__ import annotations

import enum


class ClosedSet(str, enum.Enum):
    """Members are declared as `NAME = "value", "what it means"`."""

    def __new__(cls, value: str, meaning: str):
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        return member

    def __str__(self) -> str:
        return self.value

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)


class ExecStatus(ClosedSet):
    """What one command in a sandbox did.

    XX is reserved for failures of the sandbox itself (it could not start, a limit could not be
    set up): it is never the model's fault and is never scored as a failure.
    """

    OK = "OK", "exit code 0"
    RE = "RE", "non-zero exit code"
    SG = "SG", "killed by a signal other than the sandbox's own timeout, memory or output kill"
    TO = "TO", "wall-clock timeout: the whole process tree was killed"
    ML = "ML", "memory limit hit (the cgroup's OOM kill)"
    OL = "OL", "output limit exceeded: the process tree was killed"
    XX = "XX", "infrastructure error: the sandbox itself failed; never the submission's fault, never scored"


class Outcome(ClosedSet):
    """One expected test's outcome. Only `passed` counts as passing (positive evidence)."""

    PASSED = "passed", "the report lists the test and it passed"
    FAILED = "failed", "the report lists the test and an assertion in it failed"
    ERROR = "error", "the report lists the test and it raised, or its set-up or teardown did"
    SKIPPED = "skipped", "the report lists the test as skipped: a required test that did not run fails"
    MISSING = "missing", ("the test is absent from the report (not collected, the suite never ran or was killed, "
                          "or the diff did not apply): a failure")


class FailureReason(ClosedSet):
    """Why a grading did not pass (null when it passed)."""

    DIFF_DOES_NOT_APPLY = "diff_does_not_apply", "the submitted diff does not apply to the repository"
    COLLECTION_ERROR = "collection_error", "a test module could not be imported or collected"
    MISSING_MODULE = "missing_module", "an import failed: a module is not installed or was removed"
    MISSING_COMMAND = "missing_command", "the test command runs a program the environment does not have"
    NETWORK_UNAVAILABLE = "network_unavailable", "the test command needed the network, which the task does not have"
    TESTS_FAILED = "tests_failed", "the suite ran and an expected test failed, errored or was skipped"
    TESTS_MISSING = "tests_missing", "the suite ran but an expected test never ran (renamed, deleted, not collected)"
    TIMEOUT = "timeout", "the run was killed at the wall-clock limit"
    MEMORY_LIMIT = "memory_limit", "the run was killed at the memory limit"
    OUTPUT_LIMIT = "output_limit", "the run was killed for writing more output than allowed"
    NO_REPORT = "no_report", "the suite left no readable report and nothing explains why"
    TAMPERED = "tampered", "a tamper flag was raised (TamperFlag says which)"
    INFRASTRUCTURE = "infrastructure", "the sandbox itself failed"
    INVALID_TASK = "invalid_task", "the task is broken (no expected test, a test file that does not parse)"


class RewardStatus(ClosedSet):
    """Whether a grade's reward means anything (docs/grading.md, rules 1-4)."""

    SCORED = "scored", "the suite was run and judged: `reward` holds the score (0 included)"
    INVALID = "invalid", "the task is broken (no expected test, a test file that does not parse): no reward"
    INFRA_ERROR = "infra_error", ("the sandbox failed, or its output limit cut the report: no reward, "
                                  "the sample is retried or dropped, never scored 0")
    ENV_ERROR = "env_error", ("the task's environment cannot run its tests (a module the unchanged tests import, "
                              "the test command's program or the network is missing; grading/diagnosis.py): no "
                              "reward, never trained on, counted in the monitors")


class TamperFlag(ClosedSet):
    """Signs that a submission gamed the grader; each sets the reward to 0 (docs/grading.md,
    rules 5-7, and grading/protection.py)."""

    PROTECTED_PATH_MODIFIED = "protected_path_modified", ("the submission edited, deleted or got in the way "
                                                          "of a protected file or hidden test (restored "
                                                          "before grading), or a sealed file changed during "
                                                          "the run")
    RUNNER_CONFIG_ADDED = "runner_config_added", ("the submission added a file that steers the test runner "
                                                  "(conftest.py, pytest.ini, sitecustomize.py, a .pth file)")
    SHADOWS_RUNNER_MODULE = "shadows_runner_module", ("the submission added a root module named like one the "
                                                      "runner imports (json.py, _pytest/)")
    NO_REPORT = "no_report", "the suite ran but left no readable report, and no kill explains it"
    NO_VERDICT = "no_verdict", "the test command never wrote the verdict file it must write"
    EXIT_CODE_DISAGREES = "exit_code_disagrees", "the runner's exit code or verdict contradicts its report"
    EARLY_EXIT = "early_exit", "pytest's session never finished: no signed session record beside the report"
    FORGED_OUTPUT = "forged_output", ("the session record does not vouch for the report (bad signature, "
                                      "another report, pytest's reporting functions replaced)")
