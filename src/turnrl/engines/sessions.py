"""The rollout service's episodes: each session's calls recorded as exact ids, closed into :class:`Trajectory` records.

A session (``X-Turnrl-Session``, or the request's ``user`` field: ``docs/serve.md``) is one episode of an external
agent. Every call it makes through :mod:`turnrl.engines.serve` is recorded as a :class:`Call`: the exact prompt ids
the engine conditioned on, the response ids it produced, their behaviour logprobs and the weight version. Posting a
reward closes the session; :func:`trajectory_of` then lays the calls out as the collector would have:

- ``full``: every call's prompt starts with the previous call's prompt + response ids (one growing conversation).
  Turn 0 records its whole prompt, each later turn only the ids new since the previous response, exactly as
  :class:`~turnrl.agent.context.EpisodeContext` records a ``full`` episode.
- ``per_step``: any other sequence of calls. Every turn records its whole prompt.

The episode's reward is paid on its last turn (an outcome reward, component ``reward``). Closed trajectories are
appended to a JSONL file (:func:`served_row`) and queued, by the task the client names, for a training source
(:class:`~turnrl.rollout.served.ServedCollector` takes them with :meth:`SessionStore.take`).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turnrl.types import Termination, Trajectory, Turn


@dataclass
class Call:
    """One served completion: what the engine conditioned on and produced. ``response_ids`` and ``logprobs`` align."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    response_text: str  # the response decoded without special tokens (what the client received)
    finish_reason: str  # "stop" | "length"
    version: int  # the engine's weight version that produced every response token
    observation: str  # the last user message (chat) or the prompt text (completions): what the response answered


@dataclass
class Session:
    """An open episode: its calls in order, the chat messages of its last call, when it was last used."""

    calls: list[Call] = field(default_factory=list)
    messages: list[dict[str, str]] | None = None  # the last chat call's messages (None after a completions call)
    task: str | None = None  # the task the client named (``X-Turnrl-Task``); the reward may name it instead
    last_used: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Outcome:
    """What a reward post says about an episode."""

    reward: float
    success: bool = False
    truncated: bool = False  # a limit (not the task) ended the episode
    task: str | None = None
    seed: int = 0


def extends(call: Call, previous: Call) -> bool:
    """Whether ``call``'s prompt is ``previous``'s prompt + response ids followed by new ids (one conversation)."""
    head = previous.prompt_ids + previous.response_ids
    return len(call.prompt_ids) > len(head) and call.prompt_ids[: len(head)] == head


def trajectory_of(calls: list[Call], outcome: Outcome, env_id: str, task: str | None) -> Trajectory:
    """The :class:`Trajectory` of a closed session's ``calls`` (see the module docstring for the layout)."""
    full = all(extends(c, p) for p, c in zip(calls, calls[1:]))
    turns = []
    for i, c in enumerate(calls):
        cut = len(calls[i - 1].prompt_ids) + len(calls[i - 1].response_ids) if full and i else 0
        turns.append(Turn(prompt_ids=c.prompt_ids[cut:], response_ids=list(c.response_ids), logprobs=list(c.logprobs),
                          observation=c.observation, response_text=c.response_text, finish_reason=c.finish_reason,
                          info={"policy_version": c.version}))
    turns[-1].reward = outcome.reward
    turns[-1].reward_components = {"reward": outcome.reward}
    return Trajectory(env_id=env_id, seed=outcome.seed, turns=turns, success=outcome.success,
                      termination=Termination.TRUNCATED_TURNS if outcome.truncated else Termination.TERMINATED,
                      policy_version=calls[-1].version, context="full" if full else "per_step", task_key=task)


def served_row(traj: Trajectory, session: str, tokenizer) -> dict[str, Any]:
    """One JSONL row of a closed episode: the keys of ``trajectories.jsonl`` (docs/metrics.md) that exist before
    training (no step, index or advantages), plus ``session``, ``task_key``, ``context`` and ``policy_version``; each
    turn also carries the ``policy_version`` that sampled it."""
    turns = [{"observation": t.observation, "prompt_ids": t.prompt_ids, "response": t.response_text,
              "response_tokens": tokenizer.convert_ids_to_tokens(t.response_ids), "response_ids": t.response_ids,
              "logprobs": t.logprobs, "actions": t.actions, "valid": t.valid, "reward": t.reward,
              "reward_components": t.reward_components, "finish_reason": t.finish_reason,
              "policy_version": t.info["policy_version"]} for t in traj.turns]
    return {"session": session, "env_id": traj.env_id, "seed": traj.seed, "task_key": traj.task_key,
            "context": traj.context, "policy_version": traj.policy_version, "success": traj.success,
            "termination": traj.termination.value, "error": traj.error, "reward": traj.total_reward, "turns": turns}


class UnknownSession(KeyError):
    """A reward for a session that has no call (never opened, already closed, or expired)."""


class SessionStore:
    """Open sessions and closed episodes, shared by the server's request threads and a training source.

    A session idle for longer than ``session_timeout_s`` is dropped (never written or trained on) and said so on
    stderr. Closed episodes are appended to ``record_file`` (None: not written) and queued by task for :meth:`take`.
    """

    def __init__(self, tokenizer, record_file: Path | None, env_id: str, session_timeout_s: float) -> None:
        self.tokenizer = tokenizer
        self.record_file = record_file
        self.env_id = env_id
        self.session_timeout_s = session_timeout_s
        self.expired = 0  # sessions dropped for being idle too long
        self._open: dict[str, Session] = {}
        self._closed: dict[str, list[Trajectory]] = {}  # task -> closed episodes, oldest first
        self._changed = threading.Condition()

    def last(self, session: str) -> Session | None:
        """The open session ``session`` (None if there is none)."""
        with self._changed:
            self._expire()
            return self._open.get(session)

    def record(self, session: str, call: Call, messages: list[dict[str, str]] | None, task: str | None) -> None:
        """Add ``call`` to ``session`` (opening it), remembering the chat ``messages`` it answered."""
        with self._changed:
            s = self._open.setdefault(session, Session())
            s.calls.append(call)
            s.messages, s.last_used = messages, time.monotonic()
            s.task = task or s.task

    def close(self, session: str, outcome: Outcome) -> Trajectory:
        """Close ``session`` with ``outcome``: its trajectory is written and queued under its task (the outcome's,
        else the one its calls named, else the session id: an episode of a task of its own)."""
        with self._changed:
            self._expire()
            s = self._open.pop(session, None)
            if s is None:
                raise UnknownSession(session)
            task = outcome.task or s.task or session
            traj = trajectory_of(s.calls, outcome, self.env_id, task)
            if self.record_file is not None:
                with self.record_file.open("a") as f:
                    f.write(json.dumps(served_row(traj, session, self.tokenizer)) + "\n")
            self._closed.setdefault(task, []).append(traj)
            self._changed.notify_all()
            return traj

    def take(self, tasks: int, group_size: int, timeout_s: float,
             admit: Callable[[Trajectory], bool] = lambda t: True) -> list[list[Trajectory]]:
        """The first ``group_size`` closed episodes of each of the first ``tasks`` tasks to have that many, waiting
        up to ``timeout_s``; raises ``TimeoutError`` saying what arrived. Episodes ``admit`` refuses are dropped."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for key in list(self._closed):
                    self._closed[key] = [t for t in self._closed[key] if admit(t)]
                ready = [k for k, ts in self._closed.items() if len(ts) >= group_size][:tasks]
                if len(ready) == tasks:
                    groups = [self._closed[k][:group_size] for k in ready]
                    for k in ready:
                        self._closed[k] = self._closed[k][group_size:]
                    return groups
                left = deadline - time.monotonic()
                if left <= 0:
                    have = {k: len(ts) for k, ts in self._closed.items() if ts}
                    raise TimeoutError(f"waited {timeout_s:g} s for {group_size} closed episodes of each of {tasks} "
                                       f"tasks; closed episodes by task: {have or 'none'}")
                self._changed.wait(left)

    def _expire(self) -> None:
        """Drop the sessions idle for longer than ``session_timeout_s`` (the caller holds the lock)."""
        now = time.monotonic()
        for key in [k for k, s in self._open.items() if now - s.last_used > self.session_timeout_s]:
            del self._open[key]
            self.expired += 1
            print(f"turnrl serve: session {key!r} had no call for {self.session_timeout_s:g} s (serve.session_timeout_s); "
                  "dropped without a reward", file=sys.stderr)
