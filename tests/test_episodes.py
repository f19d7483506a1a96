"""Multi-turn episodes in real sandbox sessions, driven by a scripted policy (a policy whose
replies are written in advance, so the test can walk a known path through a repository task)."""

from __future__ import annotations

import os
import signal
from functools import partial

import pytest

from datastore import catalog
from datastore.store import DatasetStore, rows_to_table
from grading.submission import grade_solution
from sandbox.base import SandboxUnavailable
from task_sets.loader import load_task_set
from task_sets.patches import apply_patch
from training.agent.episodes import (
    BLANKED_OBSERVATION,
    EpisodeLimits,
    as_rollout,
    episode_messages,
    run_episodes,
)
from training.agent.sessions import episode_session
from training.agent.trajectory import VerifiedRollout, trajectory_row
from training.inference.engine import Completion, SamplingParams
from training.policy.chat import ChatFormat
from training.policy.model import generation_config
from training.policy.tokenizer import build_tokenizer
from training.sft.demonstrations import demonstrated_turns, episode_examples, warmup_examples

SHOPCART = load_task_set("shopcart")
TASK = SHOPCART.by_id["shopcart/negative-money"]
MONEY = "shopcart/money.py"
PARSE_LINE = '        return cls(int(whole) * 100 + int((fraction + "00")[:2]))'
open_episode_session = partial(episode_session, "local")


class ScriptedPolicy:
    """Replies with the script's next line on every turn, to every live episode."""

    policy_version = "scripted"

    def __init__(self, chat: ChatFormat, script: list[str]):
        self.chat, self.script, self.calls = chat, script, []

    def generate(self, prompts, params, conversations):
        self.calls.append(len(prompts))
        return [[self._reply(sum(m["role"] == "assistant" for m in conversation))] for conversation in conversations]

    def _reply(self, turn: int) -> Completion:
        ids = self.chat.reply_ids(self.script[turn])
        return Completion(list(ids), [-0.5] * len(ids), "stop", self.chat.tokenizer.decode(ids))


@pytest.fixture(scope="module")
def chat():
    tokenizer = build_tokenizer()
    return ChatFormat.of(tokenizer, generation_config(tokenizer))


ROOMY = EpisodeLimits(max_turns=6, max_tokens=60_000)


def episodes_for(chat, script, n=1, limits=ROOMY):
    policy = ScriptedPolicy(chat, script)
    params = SamplingParams(n=n, max_new_tokens=4000)
    return policy, run_episodes(policy, chat, [TASK], params, limits, open_episode_session, "it-1")


def test_a_scripted_policy_edits_runs_the_tests_reads_the_failure_fixes_and_passes(chat, tmp_path):
    fixed = apply_patch(TASK.files, TASK.reference_solution)[MONEY]
    script = [
        # A wrong first fix: it breaks parsing of positive amounts.
        (f'The sign is lost.\n<replace path="{MONEY}"><old>{PARSE_LINE}</old>'
         f'<new>        return cls(-int(whole) * 100)</new></replace>'),
        "<run>python3 -m pytest -q tests</run>",
        f'That broke positive amounts. Rewriting the file.\n<write path="{MONEY}">\n{fixed}</write>',
        "<run>python3 -m pytest -q tests</run>",
        "<submit/>",
    ]
    _, [episode] = episodes_for(chat, script, n=1)
    assert [t.action for t in episode.turns] == ["replace", "run", "write", "run", "submit"]
    assert [t.status for t in episode.turns] == ["ok", "error", "ok", "ok", "submitted"]
    assert "failed" in episode.turns[1].observation and episode.turns[1].exit_code == 1
    assert "passed" in episode.turns[3].observation and episode.turns[3].exit_code == 0
    assert episode.finish_reason == "submitted"
    assert apply_patch(TASK.files, episode.submission)[MONEY] == fixed
    graded = grade_solution(TASK, episode.submission, reward=SHOPCART.reward)
    assert (graded.reward, graded.tamper_flags) == (1.0, ())  # graded in a fresh sandbox, hidden tests and all
    replay_from_parquet(chat, episode, graded, tmp_path)


def replay_from_parquet(chat, episode, graded, tmp_path):
    """The stored row alone tells the episode again: reply, action, status, exit code, observation."""
    rollout = as_rollout(episode, chat)
    row = trajectory_row(VerifiedRollout(rollout, TASK, graded, verify_s=0.5))
    DatasetStore(str(tmp_path)).write_partition("trajectories", "exp", 1, rows_to_table("trajectories", [row]))
    replay = catalog.connect(str(tmp_path)).sql(
        "SELECT t.index, t.action, t.status, t.exit_code, t.reply, t.observation_excerpt, reward "
        "FROM trajectories, UNNEST(turns) AS u(t) ORDER BY t.index").fetchall()
    assert [(r[1], r[2], r[3]) for r in replay] == [("replace", "ok", None), ("run", "error", 1), ("write", "ok", None),
                                                     ("run", "ok", 0), ("submit", "submitted", None)]
    assert replay[1][4] == "<run>python3 -m pytest -q tests</run>" and "failed" in replay[1][5]
    assert {r[6] for r in replay} == {1.0}


def test_the_context_is_sampled_tokens_with_mask_1_and_observations_with_mask_0(chat):
    script = ["<run>echo hello</run>", "<submit/>"]
    _, [episode] = episodes_for(chat, script)
    sampled = [chat.reply_ids(line) for line in script]
    trained = [t for t, m in zip(episode.response_ids, episode.loss_mask) if m == 1]
    assert trained == sampled[0] + sampled[1]  # exactly the sampled tokens, in order
    observed = chat.tokenizer.decode([t for t, m in zip(episode.response_ids, episode.loss_mask) if m == 0])
    assert observed == "\n<|im_start|>user\n[OK exit 0]\nhello\n<|im_end|>\n<|im_start|>assistant\n"
    assert episode.behaviour_logprobs == [-0.5 if m else 0.0 for m in episode.loss_mask]
    assert len(episode.response_ids) == len(episode.loss_mask)


def test_an_episodes_row_counts_sampled_and_observation_tokens_apart(chat):
    _, [episode] = episodes_for(chat, ["<run>echo hello</run>", "<submit/>"])
    graded = grade_solution(TASK, episode.submission, reward=SHOPCART.reward)
    row = trajectory_row(VerifiedRollout(as_rollout(episode, chat), TASK, graded, verify_s=0.5))
    assert row["sampled_tokens"] == sum(t.sampled_tokens for t in episode.turns) == sum(episode.loss_mask)
    assert row["observation_tokens"] == episode.loss_mask.count(0) > 0
    assert row["prompt_tokens"] == len(episode.prompt_ids)


def test_each_limit_ends_episodes_and_is_recorded(chat):
    loose = EpisodeLimits(max_turns=3, max_tokens=60_000)
    _, [looping] = episodes_for(chat, ["<run>true</run>"] * 3, limits=loose)
    assert (looping.finish_reason, len(looping.turns)) == ("max_turns", 3)
    first_turn_only = len(chat.prompt_ids(episode_messages(chat, TASK))) + 4000  # the 4000-token budget fits once
    _, [long] = episodes_for(chat, ["<run>true</run>"] * 3,
                             limits=EpisodeLimits(max_turns=3, max_tokens=first_turn_only))
    assert (long.finish_reason, len(long.turns)) == ("max_tokens", 1)
    _, [slow] = episodes_for(chat, ["<run>true</run>"], limits=EpisodeLimits(max_turns=3, max_tokens=60_000,
                                                                                   wall_s=0.0))
    assert (slow.finish_reason, slow.turns) == ("wall_time", [])


def test_live_episodes_advance_together_and_a_malformed_reply_is_an_observation(chat):
    policy, episodes = episodes_for(chat, ["I will fix it.", "<run>ls shopcart</run>", "<submit/>"], n=3)
    assert policy.calls == [3, 3, 3]  # one batched generation per turn for the three episodes
    for episode in episodes:
        malformed, listed, _ = episode.turns
        assert (malformed.action, malformed.status) == ("malformed", "error")
        assert malformed.observation.startswith("error: no action found. Actions (one per turn)")
        assert "money.py" in listed.observation and episode.finish_reason == "submitted"
        assert episode.submission == ""  # nothing changed: an empty diff
    assert [e.sample_index for e in episodes] == [0, 1, 2] and {e.group_id for e in episodes} == {
        "it-1/shopcart/negative-money"}



def test_episodes_past_max_live_run_in_waves_each_in_a_reset_session_of_the_last_wave(chat):
    opened = []

    def counting(task, previous=None):
        session = open_episode_session(task, previous)
        if session is not previous:
            opened.append(session)
        return session

    policy = ScriptedPolicy(chat, ["<run>ls -A . /tmp; echo mine > mark.txt; echo t > /tmp/t</run>", "<submit/>"])
    episodes = run_episodes(policy, chat, [TASK], SamplingParams(n=3, max_new_tokens=4000), ROOMY, counting, "it-1",
                            max_live=2)
    assert policy.calls == [2, 2, 1, 1]  # a wave of two episodes, then one
    assert len(opened) == 2  # the third episode ran in a session of the first wave
    for episode in episodes:
        assert "mark.txt" not in episode.turns[0].observation and "/tmp:\n[" not in episode.turns[0].observation
        assert episode.submission.count("+++ b/mark.txt") == 1
    for session in opened:
        with pytest.raises(RuntimeError, match="is closed"):
            session.exec(["true"])


def test_a_session_serves_the_next_task_only_under_the_same_sandbox_spec():
    other_task = TASK.model_copy(update={"limits": TASK.limits.model_copy(update={"memory_mb": 123})})
    first = open_episode_session(TASK)
    second = None
    try:
        first.exec(["sh", "-c", "echo x > /tmp/left; echo y > left.txt"])
        assert open_episode_session(TASK, first) is first
        assert first.exec(["sh", "-c", "ls -A /tmp; ls left.txt"]).stdout == ""
        second = open_episode_session(other_task, first)
        assert second is not first and second.spec.limits.memory_mb == 123
        with pytest.raises(RuntimeError, match="is closed"):
            first.exec(["true"])  # closed when it could not serve
    finally:
        for session in (first, second):
            if session is not None:
                session.close()


def test_a_session_whose_sandbox_failed_is_replaced_instead_of_reset():
    first = open_episode_session(TASK)
    try:
        # The sandbox user cannot reach the supervisor: the host kills it, as a crash would.
        os.kill(first._executor._proc.pid, signal.SIGKILL)
        with pytest.raises(SandboxUnavailable):
            first.reset()
        replacement = open_episode_session(TASK, first)
    finally:
        first.close()
    with replacement:
        assert replacement is not first and replacement.exec(["ls", "shopcart"]).ok


REPAIR = load_task_set("repair").train()[0]


@pytest.mark.parametrize("task", [TASK, load_task_set("default").by_id["default/add_k/0000"], REPAIR],
                         ids=["repository", "function", "check-command"])
def test_a_warm_up_example_is_the_token_sequence_its_episode_produces(chat, task):
    """The demonstration (for a task with a check command: played in a sandbox, run, write, run
    again, submit) is, token for token and mask for mask, what the same replies produce as an episode."""
    turns = demonstrated_turns([task], open_episode_session)[task.id]
    [example] = episode_examples(chat, task, turns)
    policy = ScriptedPolicy(chat, [reply for reply, _ in turns])
    [episode] = run_episodes(policy, chat, [task], SamplingParams(n=1, max_new_tokens=4000), ROOMY, open_episode_session,
                             "warm")
    assert (episode.prompt_ids, episode.response_ids, episode.loss_mask) == (example.prompt, example.response,
                                                                           example.scored)
    assert episode.finish_reason == "submitted"
    assert grade_solution(task, episode.submission).reward_components["all_passed"] == 1.0
    if task.check_command:
        assert [t.action for t in episode.turns] == ["run", "write", "run", "submit"]
        assert "FAIL" in episode.turns[0].observation and "want:" in episode.turns[0].observation
        assert episode.turns[2].exit_code == 0 and "passed" in episode.turns[2].observation


def test_a_reference_that_fails_its_own_check_is_never_demonstrated():
    """The demonstration submits once the check passes: a reference that fails it would teach
    submitting a failing fix."""
    broken = REPAIR.model_copy(update={"reference_solution": REPAIR.reference_solution.replace("return ", "return 1 + ")})
    with pytest.raises(RuntimeError, match="its reference solution fails its check command"):
        demonstrated_turns([broken], open_episode_session)


def test_a_task_with_a_check_command_is_not_demonstrated_as_a_single_reply(chat):
    """Its prompt does not say what the tests expect: only the episode that runs the check can."""
    examples = warmup_examples(chat, [REPAIR], open_session=open_episode_session)
    assert len(examples) == 1 and examples[0].scored is not None
    with pytest.raises(ValueError, match="give open_session"):
        warmup_examples(chat, [REPAIR])


def test_blanked_observations_hide_what_the_actions_answered_but_the_actions_still_run(chat):
    """The evaluation with observations blanked: the policy's context shows the same fixed text
    after every action; the turns keep what the commands really printed."""
    script = ["<run>python3 check.py</run>", '<write path="solution.py">\nx = 1\n</write>', "<submit/>"]
    policy = ScriptedPolicy(chat, script)
    [episode] = run_episodes(policy, chat, [REPAIR], SamplingParams(n=1, max_new_tokens=4000), ROOMY,
                             open_episode_session, "blind", blanked=True)
    run, write, _ = episode.turns
    assert run.exit_code == 1 and "want:" in run.observation and write.observation.startswith("wrote ")
    shown = chat.tokenizer.decode([t for t, m in zip(episode.response_ids, episode.loss_mask) if m == 0])
    assert shown.count(BLANKED_OBSERVATION) == 2 and "want:" not in shown and "wrote" not in shown
    assert episode.submission == "x = 1\n"  # the write really happened
