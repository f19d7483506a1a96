"""Turn-level analytics and the value of execution feedback, as SQL views (datastore/metrics.py)
over real episodes: scripted policies act on a repair task in sandbox sessions, the submissions
are graded in fresh sandboxes, and the rows are stored as an iteration's trajectories."""

from __future__ import annotations

import dataclasses

import pytest
from test_episodes import ScriptedPolicy, open_episode_session

from datastore import catalog, metrics
from datastore.schema import Observations
from datastore.store import DatasetStore, rows_to_table
from grading.submission import grade_solution
from task_sets.loader import load_task_set
from training.agent.episodes import EpisodeLimits, as_rollout, run_episodes
from training.agent.rollout import Rollout
from training.agent.trajectory import VerifiedRollout, evaluation_row, trajectory_row
from training.inference.engine import SamplingParams
from training.policy.chat import ChatFormat
from training.policy.model import generation_config
from training.policy.tokenizer import build_tokenizer

REPAIR = load_task_set("repair")
TASK = REPAIR.train()[0]
FIX = f'<write path="solution.py">\n{TASK.reference_solution}</write>'
RUN = f"<run>{TASK.check_command}</run>"
SCRIPTS = {
    "reads the check, then fixes": [RUN, FIX, "<submit/>"],
    "fixes, then checks": [FIX, RUN, "<submit/>"],
    "submits blind": ["<submit/>"],
    "malformed, then repeats its command": ["<run>python3 check.py", RUN, RUN, "<submit/>"],
    "reads, fixes, checks the fix, and its turns run out": [RUN, FIX, RUN],  # the workspace is its submission
}


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> str:
    tokenizer = build_tokenizer()
    chat = ChatFormat.of(tokenizer, generation_config(tokenizer))
    rows = []
    for index, script in enumerate(SCRIPTS.values()):
        [episode] = run_episodes(ScriptedPolicy(chat, script), chat, [TASK], SamplingParams(n=1, max_new_tokens=400),
                                 EpisodeLimits(max_turns=len(script), max_tokens=60_000), open_episode_session, "it")
        rollout = dataclasses.replace(as_rollout(episode, chat), sample_index=index)
        rows.append(trajectory_row(VerifiedRollout(rollout, TASK, grade_solution(TASK, rollout.solution), 0.1)))
    root = str(tmp_path_factory.mktemp("data"))
    DatasetStore(root).write_partition("trajectories", "exp", 1, rows_to_table("trajectories", rows))
    return root


def test_each_episode_says_how_it_used_its_turns(stored: str) -> None:
    con = catalog.connect(stored)
    got = metrics.records(con, "SELECT sample_index, turns, runs, edits, ran_before_submitting, checked_last_edit, "
                          "malformed_turns, repeated_commands, passed FROM episodes ORDER BY sample_index")
    assert [{k: v for k, v in row.items() if k != "sample_index"} for row in got] == [
        dict(turns=3, runs=1, edits=1, ran_before_submitting=True, checked_last_edit=False, malformed_turns=0,
             repeated_commands=0, passed=True),
        dict(turns=3, runs=1, edits=1, ran_before_submitting=True, checked_last_edit=True, malformed_turns=0,
             repeated_commands=0, passed=True),
        dict(turns=1, runs=0, edits=0, ran_before_submitting=False, checked_last_edit=None, malformed_turns=0,
             repeated_commands=0, passed=False),
        dict(turns=4, runs=2, edits=0, ran_before_submitting=True, checked_last_edit=None, malformed_turns=1,
             repeated_commands=1, passed=False),
        dict(turns=3, runs=2, edits=1, ran_before_submitting=True, checked_last_edit=True, malformed_turns=0,
             repeated_commands=0, passed=True),
    ]


def test_an_iteration_summarises_its_turns_and_pass_rate_by_turns(stored: str) -> None:
    con = catalog.connect(stored)
    [summary] = metrics.records(con, "SELECT * FROM turn_analytics")
    assert summary["episodes"] == 5 and summary["turns_per_episode"] == pytest.approx(14 / 5)
    assert summary["ran_before_submitting_share"] == pytest.approx(4 / 5)  # the one that ran out of turns too
    assert summary["submitted_share"] == pytest.approx(4 / 5)
    assert summary["wasted_turn_share"] == pytest.approx(2 / 14)  # one malformed reply, one repeated command
    assert summary["pass_rate"] == pytest.approx(3 / 5)
    by_turns = con.execute("SELECT turns, episodes, pass_rate FROM pass_rate_by_turns ORDER BY turns").fetchall()
    assert by_turns == [(1, 1, 0.0), (3, 3, 1.0), (4, 1, 0.0)]


def test_failing_observations_count_one_kind_of_failure_once_whatever_its_values(stored: str) -> None:
    con = catalog.connect(stored)
    failures = con.execute("SELECT failure, runs FROM failing_observations ORDER BY runs DESC").fetchall()
    # The check failed four times on the starting code (values masked); the runs after a fix passed.
    assert failures == [(f"FAIL {TASK.entry_point}(#, #): expected #, got #", 4)]


def test_the_value_of_feedback_pairs_shown_and_blanked_evaluations_by_task(tmp_path) -> None:
    """Per task, the pass rate with observations shown less the one with them blanked; the mean
    over tasks and its paired standard error."""
    tasks = REPAIR.eval()[:3]
    passes = {Observations.SHOWN: [[1, 1], [1, 0], [0, 0]], Observations.BLANKED: [[0, 0], [0, 0], [0, 1]]}
    rows = []
    for observations, per_task in passes.items():
        for task, outcomes in zip(tasks, per_task):
            for index, passed in enumerate(outcomes):
                solution = task.reference_solution if passed else "x = 1\n"
                rollout = Rollout(task.id, f"eval/{task.id}", index, "p", [1], [2], None, "stop", solution, 0.0,
                                  solution)
                rows.append(evaluation_row(VerifiedRollout(rollout, task, grade_solution(task, solution), 0.1),
                                           observations))
    DatasetStore(str(tmp_path)).write_partition("evaluations", "exp", 2, rows_to_table("evaluations", rows))
    con = catalog.connect(str(tmp_path))
    [value] = metrics.records(con, "SELECT * FROM feedback_value")
    gaps = [1.0, 0.5, -0.5]
    mean = sum(gaps) / 3
    stderr = (sum((g - mean) ** 2 for g in gaps) / 2) ** 0.5 / 3 ** 0.5
    assert value["tasks"] == 3 and value["pass_rate"] == pytest.approx(0.5)
    assert value["blanked_pass_rate"] == pytest.approx(1 / 6) and value["feedback_gap"] == pytest.approx(mean)
    assert value["feedback_gap_stderr"] == pytest.approx(stderr)
    [held_out] = metrics.records(con, "SELECT * FROM held_out")
    assert held_out["pass_rate"] == pytest.approx(0.5) and held_out["samples"] == 6  # shown samples only
