"""Multi-turn episodes: the policy acts in its own sandbox session until it submits or a limit ends it.

Every turn, all live episodes advance together: one batched generation call for every episode
still running, then each parsed action (training/agent/actions.py) runs in that episode's session,
concurrently. The context is one token sequence per episode: the prompt, then for each turn the
tokens the policy sampled (loss mask 1, with their behaviour log-probs) and the observation the
environment answered with (loss mask 0), in the chat template's own framing. The tokens trained
on are exactly the tokens sampled: nothing the policy wrote is decoded and re-encoded.

An episode ends when the policy submits (`submitted`), or at a limit: `max_turns`, `max_tokens`
(the next turn would not fit the context budget) or `wall_time`. Whatever ends it, its
workspace is the submission: a diff against the task's files for a repository task, solution.py
(less the task's prefix) for a function task. Grading happens later, in a fresh sandbox, by the
verification protocol; never in the working session.

An episode run `blanked` is shown BLANKED_OBSERVATION after every action instead of its answer:
the evaluation that measures what execution feedback is worth to the policy.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from datastore.schema import FinishReason
from sandbox.base import Session, WorkspacePathError
from task_sets.patches import make_patch, text_files_from_tar
from task_sets.schema import SOLUTION_FILE, RepositoryTask, Task
from training.agent.actions import USAGE, Action, Malformed, Replace, Run, Submit, Write, parse_action
from training.agent.rollout import Rollout, Turn
from training.agent.sessions import OpenSession
from training.inference.engine import Completion, InferenceEngine, SamplingParams
from training.policy.chat import ChatFormat

OBSERVATION_CHARS = 1200  # of command output shown to the policy per turn
SYSTEM_MESSAGE = f"You work in a sandboxed repository. {USAGE}"
# What a policy evaluated blind is shown instead of every observation: the same text whatever
# happened, so nothing of the environment's answer reaches it (the exit status neither).
BLANKED_OBSERVATION = "[output hidden]"
# Episodes live at once: enough for full generation batches (training/inference batches 64 rows),
# few enough that their sandboxes are re-used wave after wave instead of opened one per episode.
MAX_LIVE = 256


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 4
    max_tokens: int = 1024  # the whole context: prompt, replies and observations
    wall_s: float = 300.0  # per episode, generation and sandbox time together
    command_timeout_s: float = 30.0  # per <run>


@dataclass
class Episode:
    task: Task
    group_id: str
    sample_index: int
    policy_version: str
    prompt_ids: list[int]
    messages: list[dict[str, str]]  # the conversation the context renders (for engines that take messages)
    session: Session | None = field(default=None, repr=False)
    response_ids: list[int] = field(default_factory=list)  # everything after the prompt
    loss_mask: list[int] = field(default_factory=list)
    behaviour_logprobs: list[float] | None = field(default_factory=list)  # 0.0 where the mask is 0
    turns: list[Turn] = field(default_factory=list)
    finish_reason: FinishReason | None = None  # set when the episode ends
    submission: str = ""
    started: float = field(default_factory=time.monotonic)

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


def run_episodes(
    engine: InferenceEngine,
    chat: ChatFormat,
    tasks: Sequence[Task],
    params: SamplingParams,
    limits: EpisodeLimits,
    open_session: OpenSession,
    group_prefix: str,
    progress: Callable[[int, int], None] | None = None,
    system: str | None = None,
    blanked: bool = False,
    max_live: int = MAX_LIVE,
) -> list[Episode]:
    """`params.n` episodes for every task, `max_live` at a time (a wave), each in a session from
    `open_session` (training/agent/sessions.py: a wave's sessions are the last wave's, reset);
    `system` is the task set's system message; `progress(ended, total)` after every turn.
    `blanked`: the actions run as usual, but the policy is shown BLANKED_OBSERVATION instead of
    what they answered (what a policy makes of the environment's feedback is the difference)."""
    def start(task: Task, index: int) -> Episode:
        messages = episode_messages(chat, task, system)
        return Episode(task, f"{group_prefix}/{task.id}", index, engine.policy_version, chat.prompt_ids(messages),
                       messages)

    def after_turn() -> None:
        if progress:
            progress(sum(e.done for e in episodes), len(episodes))

    episodes = [start(task, index) for task in tasks for index in range(params.n)]
    idle: list[Session] = []  # ended episodes' sessions, for the next wave's
    with ThreadPoolExecutor(max(1, min(len(episodes), 8))) as pool:
        try:
            for first in range(0, len(episodes), max_live):
                wave = episodes[first : first + max_live]
                taken = min(len(idle), len(wave))
                handed: list[Session | None] = [*idle[len(idle) - taken :], *[None] * (len(wave) - taken)]
                _each(pool, _open, wave, handed, [open_session] * len(wave))
                del idle[len(idle) - taken :]  # only now: should an opening fail, those left are closed below
                wave_params = dataclasses.replace(params, seed=params.seed + first)  # a random stream per wave
                _play(wave, engine, chat, wave_params, limits, pool, blanked, after_turn)
                _each(pool, _submit, wave)
                idle += [e.session for e in wave]
                for episode in wave:
                    episode.session = None
        finally:
            _each(pool, _close, idle + [e.session for e in episodes])  # closing twice is a no-op
    return episodes


def _each(pool: ThreadPoolExecutor, function: Callable[..., None], *arguments: Sequence) -> None:
    """`function` over the arguments on the pool, every call finished before the first error is
    raised (pool.map raises while the others still run: on sessions about to be closed)."""
    futures = [pool.submit(function, *call) for call in zip(*arguments)]
    wait(futures)
    for future in futures:
        future.result()


def _play(wave: list[Episode], engine: InferenceEngine, chat: ChatFormat, params: SamplingParams,
          limits: EpisodeLimits, pool: ThreadPoolExecutor, blanked: bool, after_turn: Callable[[], None]) -> None:
    """Every turn: one batched generation for the wave's live episodes, then their actions."""
    for turn in range(limits.max_turns):
        live = [e for e in wave if not e.done and not _out_of_budget(e, params, limits)]
        if not live:
            break
        began = time.perf_counter()
        turn_params = dataclasses.replace(params, n=1, seed=params.seed + turn)
        completions = engine.generate([e.context for e in live], turn_params, [e.messages for e in live])
        share = (time.perf_counter() - began) / len(live)
        _each(pool, _act, live, [group[0] for group in completions], [share] * len(live), [chat] * len(live),
              [limits] * len(live), [blanked] * len(live))
        after_turn()
    unfinished = [e for e in wave if not e.done]
    for episode in unfinished:
        episode.finish_reason = FinishReason.MAX_TURNS
    if unfinished:
        after_turn()


def episode_messages(chat: ChatFormat, task: Task, system: str | None = None) -> list[dict[str, str]]:
    """The system message (the task set's, followed by the actions' usage; else SYSTEM_MESSAGE)
    and the task as the user's."""
    return chat.messages(f"{system}\n\n{USAGE}" if system else SYSTEM_MESSAGE, task.prompt)


def _open(episode: Episode, previous: Session | None, open_session: OpenSession) -> None:
    episode.started = time.monotonic()  # its wall time counts from its wave
    episode.session = open_session(episode.task, previous)


def _out_of_budget(episode: Episode, params: SamplingParams, limits: EpisodeLimits) -> bool:
    if time.monotonic() - episode.started > limits.wall_s:
        episode.finish_reason = FinishReason.WALL_TIME
    elif len(episode.context) + params.max_new_tokens > limits.max_tokens:
        episode.finish_reason = FinishReason.MAX_TOKENS
    return episode.done


def _act(episode: Episode, completion: Completion, generate_s: float, chat: ChatFormat, limits: EpisodeLimits,
         blanked: bool) -> None:
    """Take the sampled reply into the context, run its action, answer with an observation (the
    turn stores what the action answered, also when the policy was shown BLANKED_OBSERVATION)."""
    episode.response_ids += completion.token_ids
    episode.loss_mask += [1] * len(completion.token_ids)
    if episode.behaviour_logprobs is not None and completion.logprobs is not None:
        episode.behaviour_logprobs += completion.logprobs
    else:
        episode.behaviour_logprobs = None  # one turn without log-probs makes the episode untrainable
    reply = chat.reply_text(completion.text)
    action = parse_action(reply)
    began = time.perf_counter()
    kind, detail, status, exit_code, observation = perform(episode.session, action, limits.command_timeout_s)
    episode.turns.append(Turn(reply, kind, detail, status, exit_code, observation, generate_s,
                              time.perf_counter() - began, len(completion.token_ids)))
    if isinstance(action, Submit):
        episode.finish_reason = FinishReason.SUBMITTED
        return
    shown = BLANKED_OBSERVATION if blanked else observation
    # Closed only by the template's own close: a reply that stopped at another stop token, was
    # cut at its budget, or came back as a server's text gets the template's close.
    observed = chat.observation_ids(shown, reply_closed=chat.closes_turn(completion.token_ids))
    episode.messages = [*episode.messages, {"role": "assistant", "content": reply},
                        {"role": chat.observation_role, "content": shown}]
    episode.response_ids += observed
    episode.loss_mask += [0] * len(observed)
    if episode.behaviour_logprobs is not None:
        episode.behaviour_logprobs += [0.0] * len(observed)


def wrote(path: str, content: str) -> str:
    """The observation after a write."""
    return f"wrote {len(content.encode())} bytes to {path}"


def perform(session: Session, action: Action, command_timeout_s: float) -> tuple[str, str, str, int | None, str]:
    """(action, detail, status, exit code, observation) of one action in an episode's session."""
    match action:
        case Submit():
            return "submit", "", "submitted", None, "submitted"
        case Malformed(reason=reason):
            return "malformed", reason, "error", None, f"error: {reason}"
        case Run(command=command):
            result = session.exec(["/bin/sh", "-c", command], timeout_s=command_timeout_s)
            output = (result.stdout + result.stderr)[-OBSERVATION_CHARS:]
            status = "ok" if result.ok else "error"
            return "run", command, status, result.exit_code, f"[{result.status.value} exit {result.exit_code}]\n{output}"
        case Write(path=path, content=content):
            try:
                session.put_files({path: content})
            except WorkspacePathError as e:
                return "write", path, "error", None, f"error: {e}"
            return "write", path, "ok", None, wrote(path, content)
        case Replace(path=path, old=old, new=new):
            return ("replace", path, *_replace(session, path, old, new))
    raise TypeError(f"unknown action {action!r}")


def _replace(session: Session, path: str, old: str, new: str) -> tuple[str, None, str]:
    try:
        text = session.get_files([path])[path].decode("utf-8")
    except (WorkspacePathError, UnicodeDecodeError) as e:
        return "error", None, f"error: cannot read {path}: {e}"
    count = text.count(old)
    if count != 1:
        return "error", None, f"error: the old text occurs {count} times in {path}; it must occur exactly once"
    session.put_files({path: text.replace(old, new, 1)})
    return "ok", None, f"replaced 1 occurrence in {path}"


def _submit(episode: Episode) -> None:
    """The episode's workspace as its submission."""
    if episode.session is None:
        return
    try:
        files = text_files_from_tar(episode.session.snapshot())
    except WorkspacePathError as e:  # a workspace too big to snapshot: nothing gradable
        episode.submission = ""
        episode.turns.append(Turn("", "submit", "", "error", None, f"error: {e}", 0.0, 0.0, 0))
        return
    task = episode.task
    if isinstance(task, RepositoryTask):
        episode.submission = make_patch(task.files, files)
    else:
        episode.submission = files.get(SOLUTION_FILE, "").removeprefix(task.solution_prefix)


def as_rollout(episode: Episode, chat: ChatFormat) -> Rollout:
    """The episode as a sample: its whole context, mask and turns, for grading and storage."""
    return Rollout(
        task_id=episode.task.id, group_id=episode.group_id, sample_index=episode.sample_index,
        policy_version=episode.policy_version, prompt_ids=episode.prompt_ids, response_ids=episode.response_ids,
        behaviour_logprobs=episode.behaviour_logprobs, finish_reason=episode.finish_reason,
        response_text=chat.tokenizer.decode(episode.response_ids, skip_special_tokens=False),
        generate_s=sum(t.generate_s for t in episode.turns), loss_mask=episode.loss_mask,
        turns=tuple(episode.turns), solution=episode.submission,
    )


def _close(session: Session | None) -> None:
    if session is not None:
        session.close()
