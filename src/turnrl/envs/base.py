"""The Env contract: a small, typed, text-in / text-out interface whose docstrings define the semantics.

An environment is a task the agent works on over several turns. Observations and actions are text:
the env renders its state for the model and parses the model's free text into actions itself, so the
same env works with any model, prompt format or action syntax it chooses to accept.

``step`` returns ``(observation, reward, terminated, truncated, info)``:

- ``terminated``: the env reached a terminal state of the task (goal reached, fell in a hole, deadlock
  the env can detect). Nothing the agent does afterwards matters; a critic must not bootstrap.
- ``truncated``: a limit outside the task stopped the episode (turn limit, time). The state is not
  terminal; a critic bootstraps from it. Set by wrappers such as :class:`~turnrl.envs.wrappers.TurnLimit`,
  which also put the limit's name in ``info["truncation"]``.

The ``info`` dict of ``step`` carries these keys (the collector reads them; envs may add more):

- ``"actions"``: list[str], the actions parsed from the text and executed this turn (maybe empty);
- ``"valid"``: bool, False when the text held no valid action (the env then answers with feedback in
  the observation and leaves its state unchanged; it never raises for bad model output);
- ``"success"``: bool, whether the task is solved (the env's verifier); meaningful at every step;
- ``"reward_components"``: dict[str, float], named parts of ``reward`` that sum to it (``"outcome"``,
  ``"step"``, ``"invalid_penalty"``, ...). Wrappers that change the reward add their own component.

Two keys name what the agent is working on, both text:

- ``anchor()``: the current state without history (GiGPO groups the turns of a group by it);
- ``task_key()``: what makes two tasks the same (map layout, puzzle, question id, product, program); valid
  after ``reset`` and fixed for the episode. Held-out sets are disjoint from training by task key, not by
  seed: two seeds that draw the same map are the same task. The default is the initial observation of the
  last reset; an env whose tasks differ in hidden state (a secret number, hidden tests, a deck) must
  override it, or different tasks share a key.

``areset`` / ``astep`` are what the collector awaits. By default they call ``reset`` / ``step`` inline: an
env that computes (a grid, a puzzle, a parser) answers in microseconds, and inline calls keep a rollout
deterministic (the engine batches the same requests at the same ticks on every run). An env that waits on a
subprocess, a disk or a network sets ``blocking_io = True``: its calls then run in a daemon worker thread, so
the other episodes keep generating and the collector's per-step timeout (``env.step_timeout_s``) can end a step
that hangs; the price is that batches (and so the low bits of logprobs) depend on when the threads finish.
Such an env draws only from its own seeded RNG, never from global random state another thread may use. Envs
that wait on a network may instead override ``areset`` / ``astep`` with real coroutines.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from typing import Any, ClassVar


class Env:
    """Base class for turnrl environments (subclass it, or satisfy the same protocol).

    Class attributes an env sets:

    - ``instructions``: task description and action format, shown to the model as the system prompt;
    - ``max_actions_per_turn``: how many actions one response may carry (extra ones are ignored).
    """

    instructions: ClassVar[str] = ""
    max_actions_per_turn: int = 1
    blocking_io: ClassVar[bool] = False  # True: reset/step wait on I/O; run them in a worker thread (module docstring)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Make every subclass's ``reset``/``areset`` remember its observation, for the default :meth:`task_key`."""
        super().__init_subclass__(**kwargs)
        for name in ("reset", "areset"):
            if name in cls.__dict__:
                setattr(cls, name, _remembering_observation(cls.__dict__[name]))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start a new episode. The same ``seed`` gives the same initial state and the same dynamics.

        Returns ``(observation, info)``; ``info`` may hold anything useful for logging.
        """
        raise NotImplementedError

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the model's response text. See the module docstring for the meaning of each return value."""
        raise NotImplementedError

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """``reset``: inline, or in a worker thread when ``blocking_io`` (see the module docstring)."""
        if self.blocking_io:
            return await in_daemon_thread(functools.partial(self.reset, seed=seed, options=options))
        return self.reset(seed=seed, options=options)

    async def astep(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """``step``: inline, or in a worker thread when ``blocking_io`` (see the module docstring)."""
        if self.blocking_io:
            return await in_daemon_thread(functools.partial(self.step, action_text))
        return self.step(action_text)

    def anchor(self) -> str:
        """A hashable key of the current state without history (GiGPO groups steps by it)."""
        raise NotImplementedError

    def situation(self) -> str:
        """What the agent faces now in terms that recur across tasks (on a map: the cells next to it and the goal's
        rough direction), unlike :meth:`anchor`, which names the task too. The experience library can look records up
        by it (``experience.key=situation``) so that what was learned on training tasks is found on unseen ones."""
        raise NotImplementedError

    def task_key(self) -> str:
        """What makes two tasks the same (see the module docstring); the same for the whole episode.

        Default: the initial observation of the last ``reset``. Override it when tasks differ in hidden state.
        Raises ``RuntimeError`` before the first reset.
        """
        observation = getattr(self, "_reset_observation", None)
        if observation is None:
            raise RuntimeError(f"{type(self).__name__}.task_key() before reset(): the task is drawn by reset")
        return observation

    def solve(self) -> list[str] | None:
        """Oracle: a shortest action sequence from the current state to success, or None if none exists."""
        raise NotImplementedError

    def examples(self) -> list[tuple[str, str]]:
        """A few (observation, ideal response) pairs, used as few-shot exchanges in prompts.

        They are built from fixed instances that are not training or evaluation seeds.
        """
        return []

    def render(self) -> str:
        """The current state as text (what a person sees in ``turnrl play``)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources. Safe to call more than once."""

    @property
    def unwrapped(self) -> "Env":
        return self

    def __enter__(self) -> "Env":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _remembering_observation(reset: Callable[..., Any]) -> Callable[..., Any]:
    """``reset`` (or the coroutine ``areset``) that also stores the observation it returns as ``_reset_observation``."""

    def remember(env: Env, out: Any) -> Any:
        if isinstance(out, tuple) and out and isinstance(out[0], str):  # check_env reports any other shape
            env._reset_observation = out[0]
        return out

    if asyncio.iscoroutinefunction(reset):
        @functools.wraps(reset)
        async def areset(self: Env, *args: Any, **kwargs: Any) -> Any:
            return remember(self, await reset(self, *args, **kwargs))

        return areset

    @functools.wraps(reset)
    def sync_reset(self: Env, *args: Any, **kwargs: Any) -> Any:
        return remember(self, reset(self, *args, **kwargs))

    return sync_reset


async def in_daemon_thread(fn: Callable[[], Any]) -> Any:
    """Await ``fn()`` run in a daemon thread. Unlike ``asyncio.to_thread`` (whose pool threads are joined when the
    interpreter exits), a call that never returns cannot keep the process alive after a timeout abandoned it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not done.done():  # the awaiting task may have been cancelled (timed out) meanwhile
            done.set_exception(error) if error is not None else done.set_result(result)

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed while the call ran: nobody awaits it any more
            pass

    threading.Thread(target=run, name="turnrl-env", daemon=True).start()
    return await done
