"""The collector: drives (tasks x group size) episodes against an engine, concurrently, turn by turn.

With a plain engine, all live episodes advance in lock step: one batched ``engine.generate`` call per
turn for every episode still running, then every env's ``astep`` awaited together (so envs that wait on
a network or a subprocess overlap). With a :class:`~turnrl.engines.base.SessionEngine` (such as
:class:`~turnrl.engines.native.NativeEngine`), each episode is a coroutine holding one engine
sequence for its lifetime: the engine batches whatever turns are in flight (continuous batching) and
keeps each sequence's KV cache between turns. What the model is shown each turn is the context strategy's
(:mod:`turnrl.agent.context`), observations cut to ``ContextSpec.max_observation_tokens`` (a cut turn records
the original length in ``Turn.info["observation_truncated"]``; a ``budgeted`` turn records which earlier turns it
showed in ``Turn.info["context"]``, and a ``compress`` memory turn's summary replaces the earlier ones).
Trajectories keep the exact token ids the engine conditioned on and produced, the behaviour logprobs and the weight
version that sampled each turn (``Turn.version``: an episode in flight across a weight sync keeps both), per-turn
reward components, the anchor state each turn acted in, the task key, and why the episode ended.

A failing env ends only its own episode (``Termination.ENV_ERROR``, the reason in ``Trajectory.error``), never the
batch: ``reset``/``step`` raising, taking longer than ``step_timeout_s``, or replying in the wrong shape (an
observation that is not text), and ``anchor()`` raising. A ``close()`` that raises is recorded in
``Trajectory.error`` without changing how the episode ended. A timeout can only interrupt an env call that yields
to the event loop: a real coroutine is cancelled; the synchronous ``step`` of a ``blocking_io`` env (run in a daemon
thread by the default ``Env.astep``) cannot be stopped, so it runs on in its thread, its result is ignored and the
env is closed under it; a computing env's ``step`` runs inline (``Env`` says why) and is not timed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from turnrl.agent.chat import ChatRenderer
from turnrl.agent.context import ContextSpec, EpisodeContext
from turnrl.engines.base import Completion, Engine, SamplingParams, SessionEngine
from turnrl.envs.base import Env
from turnrl.types import Termination, Trajectory, TrajectoryGroup, Turn

T = TypeVar("T")
StepResult = tuple[str, float, bool, bool, dict[str, Any]]


class EnvFault(Exception):
    """An env call failed, took too long or broke the contract; the message says which call and how."""


@dataclass
class _Episode:
    env: Env
    traj: Trajectory
    context: EpisodeContext
    index: int = 0  # position within its group


@dataclass
class RolloutStats:
    """The collector's counters, summed over every ``collect`` since the last :meth:`Collector.take_stats`."""

    generate_s: float = 0.0
    env_s: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0


class Collector:
    """Runs episodes of envs built by ``env_factory`` against ``engine``.

    ``step_timeout_s`` bounds each env ``reset`` and ``step`` (0 = no limit); past it the episode ends as an env error.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer,
        env_factory: Callable[[], Env],
        context: ContextSpec = ContextSpec(),
        *,
        step_timeout_s: float = 60.0,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.context = context
        self.step_timeout_s = step_timeout_s
        self._renderer: ChatRenderer | None = None
        self.stats = RolloutStats()

    def renderer(self, env: Env) -> ChatRenderer:
        if self._renderer is None:
            self._renderer = ChatRenderer(self.tokenizer, env.instructions, env.examples(), few_shot=self.context.few_shot)
        return self._renderer

    def take_stats(self) -> RolloutStats:
        """The counters of every ``collect`` since the last call; starts counting afresh."""
        stats, self.stats = self.stats, RolloutStats()
        return stats

    def collect(self, seeds: Sequence[int], group_size: int, sampling: SamplingParams, env_id: str = "") -> list[TrajectoryGroup]:
        """Roll out ``group_size`` episodes for each seed; returns one group per seed, in seed order."""
        return _run(self._collect(list(seeds), group_size, sampling, env_id))

    async def _collect(self, seeds: list[int], group_size: int, sampling: SamplingParams, env_id: str) -> list[TrajectoryGroup]:
        groups = [TrajectoryGroup(env_id=env_id, seed=s) for s in seeds]
        starts = []
        for g, seed in enumerate(seeds):
            for index in range(group_size):
                traj = Trajectory(env_id=env_id, seed=seed, group_index=g, policy_version=self.engine.version, context=self.context.strategy)
                groups[g].trajectories.append(traj)
                starts.append(self._start(self.env_factory(), traj, index))
        episodes = [ep for ep in await asyncio.gather(*starts) if ep is not None]

        if isinstance(self.engine, SessionEngine):  # continuous batching, caches kept across turns
            generating, stepping = _Busy(), _Busy()
            await asyncio.gather(*(self._episode(ep, sampling, generating, stepping) for ep in episodes))
            self.stats.generate_s += generating.seconds
            self.stats.env_s += stepping.seconds
        else:
            live = episodes
            while live:
                live = await self._turn(live, sampling)
        return groups

    async def _start(self, env: Env, traj: Trajectory, index: int) -> _Episode | None:
        """Reset ``env`` to ``traj``'s task; None when that failed (the episode ended as an env error)."""
        try:
            observation = _reset_observation(await self._env_call("reset", env.areset(seed=traj.seed)))
        except EnvFault as e:
            _end(traj, env, Termination.ENV_ERROR, str(e))
            return None
        traj.task_key = _task_key(env)
        return _Episode(env, traj, EpisodeContext(self.context, self.renderer(env), observation), index)

    async def _turn(self, live: list[_Episode], sampling: SamplingParams) -> list[_Episode]:
        """Lock step: one batched generation for every live episode, then every env steps concurrently."""
        prompts, runnable = [], []
        for ep in live:
            ids = ep.context.prompt()
            if len(ids) + sampling.max_new_tokens > self.context.max_context_tokens:
                _end(ep.traj, ep.env, Termination.TRUNCATED_CONTEXT)
                continue
            prompts.append(ids)
            runnable.append(ep)
        if not runnable:
            return []
        t0 = time.perf_counter()
        completions = self.engine.generate(prompts, sampling)
        self.stats.generate_s += time.perf_counter() - t0
        self.stats.prompt_tokens += sum(len(p) for p in prompts)
        self.stats.generated_tokens += sum(len(c.token_ids) for c in completions)

        t0 = time.perf_counter()
        going_on = await asyncio.gather(*(self._act(ep, ids, comp) for ep, ids, comp in zip(runnable, prompts, completions)))
        self.stats.env_s += time.perf_counter() - t0
        return [ep for ep, more in zip(runnable, going_on) if more]

    async def _episode(self, ep: _Episode, sampling: SamplingParams, generating: _Busy, stepping: _Busy) -> None:
        """Continuous batching: one episode as a coroutine, its turns submitted to a session engine.

        The episode keeps one engine sequence for its lifetime, so the engine reuses the cached part of each
        prompt (the whole conversation under ``full``; the shared head under ``per_step``).
        """
        engine = self.engine
        seq = engine.open(sample_key=(ep.traj.seed, ep.index))
        try:
            while True:
                ids = ep.context.prompt()
                if len(ids) + sampling.max_new_tokens > self.context.max_context_tokens:
                    _end(ep.traj, ep.env, Termination.TRUNCATED_CONTEXT)
                    return
                with generating:
                    comp = await engine.agenerate(seq, ids, sampling)
                self.stats.prompt_tokens += len(ids)
                self.stats.generated_tokens += len(comp.token_ids)
                with stepping:
                    going_on = await self._act(ep, ids, comp)
                if not going_on:
                    return
        finally:
            engine.close(seq)

    async def _act(self, ep: _Episode, ids: list[int], comp: Completion) -> bool:
        """Step the env with the response to ``ids`` and record the turn; returns whether the episode goes on."""
        text = self.tokenizer.decode(comp.token_ids, skip_special_tokens=True)
        turn = Turn(
            prompt_ids=ep.context.turn_prompt_ids(ids),
            response_ids=list(comp.token_ids),
            logprobs=list(comp.logprobs),
            observation=ep.context.observation,
            response_text=text,
            finish_reason=comp.finish_reason,
            version=comp.version,
        )
        if ep.context.observation_cut is not None:
            turn.info["observation_truncated"] = ep.context.observation_cut
        turn.info.update(ep.context.record())  # budgeted: which earlier turns the prompt showed
        ep.traj.turns.append(turn)
        ep.traj.policy_version = comp.version
        try:
            turn.anchor = _anchor(ep.env)
            obs, reward, terminated, truncated, info = _step_result(await self._env_call("step", ep.env.astep(text)))
        except EnvFault as e:
            turn.valid = False
            _end(ep.traj, ep.env, Termination.ENV_ERROR, str(e))
            return False
        turn.reward = reward
        turn.reward_components = dict(info.get("reward_components", {"reward": reward}))
        turn.actions = list(info.get("actions", []))
        turn.valid = bool(info.get("valid", True))
        turn.info = {k: v for k, v in info.items() if k not in ("reward_components", "actions", "valid")} | turn.info
        ep.traj.success = bool(info.get("success", False))
        if terminated:
            _end(ep.traj, ep.env, Termination.TERMINATED)
            return False
        if truncated:
            _end(ep.traj, ep.env, Termination.TRUNCATED_CONTEXT if info.get("truncation") == "context" else Termination.TRUNCATED_TURNS)
            return False
        compressed = turn.info.get("memory") == "compress" and turn.valid  # turnrl.agent.memory
        ep.context.advance(turn.response_ids, text, obs, self.tokenizer.eos_token_id, summary=compressed)
        return True

    async def _env_call(self, what: str, call: Awaitable[T]) -> T:
        """Await an env's ``reset`` or ``step`` (``what``) for at most ``step_timeout_s``; any failure is an EnvFault.

        The call runs inline in the episode's task (no extra task, so an env that never yields changes nothing).
        """
        deadline = asyncio.timeout(self.step_timeout_s or None)
        try:
            async with deadline:  # at the deadline a coroutine is cancelled; a step in a worker thread runs on, ignored
                return await call
        except Exception as e:  # noqa: BLE001 - whatever the env raised ends only its episode
            if deadline.expired():
                raise EnvFault(f"{what} took longer than {self.step_timeout_s:g} s (env.step_timeout_s)") from None
            raise EnvFault(f"{what} failed: {type(e).__name__}: {e}") from e


class _Busy:
    """Wall seconds during which at least one of the concurrent episodes is inside a ``with`` block of this object.

    Under continuous batching the episodes wait on the engine and on their envs at overlapping times: summing each
    episode's waits would count the same second many times (and could exceed the rollout's wall time).
    """

    def __init__(self) -> None:
        self.seconds, self._inside, self._since = 0.0, 0, 0.0

    def __enter__(self) -> None:
        if self._inside == 0:
            self._since = time.perf_counter()
        self._inside += 1

    def __exit__(self, *exc: object) -> None:
        self._inside -= 1
        if self._inside == 0:
            self.seconds += time.perf_counter() - self._since


def _run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` except that it never waits for worker threads: a timed-out step may still run in one."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main)
    finally:
        pending = asyncio.all_tasks(loop)  # e.g. other episodes, when an engine error ended the collection
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _end(traj: Trajectory, env: Env, why: Termination, error: str | None = None) -> None:
    """End the episode (``error`` says why it was an env error) and close its env; a failing close is recorded."""
    traj.termination = why
    traj.error = error
    try:
        env.close()
    except Exception as e:  # noqa: BLE001 - the episode already ended; a close failure does not change how
        traj.error = "; ".join(filter(None, [error, f"close failed: {type(e).__name__}: {e}"]))


def _observation(obs: object, what: str) -> str:
    if not isinstance(obs, str):
        raise EnvFault(f"{what} returned a {type(obs).__name__} observation; an observation is str")
    return obs


def _reset_observation(res: object) -> str:
    """The observation of a ``reset`` reply ``(observation, info)``."""
    if not (isinstance(res, tuple) and len(res) == 2):
        raise EnvFault(f"reset returned {_shape(res)}, not (observation, info)")
    return _observation(res[0], "reset")


def _step_result(res: object) -> StepResult:
    """A ``step`` reply ``(observation, reward, terminated, truncated, info)``, checked."""
    if not (isinstance(res, tuple) and len(res) == 5):
        raise EnvFault(f"step returned {_shape(res)}, not (observation, reward, terminated, truncated, info)")
    obs, reward, terminated, truncated, info = res
    if not isinstance(info, dict):
        raise EnvFault(f"step returned a {type(info).__name__} info; info is a dict")
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        raise EnvFault(f"step returned the reward {reward!r}; a reward is a number") from None
    return _observation(obs, "step"), reward, bool(terminated), bool(truncated), info


def _shape(res: object) -> str:
    return f"a tuple of {len(res)}" if isinstance(res, tuple) else f"a {type(res).__name__}"


def _anchor(env: Env) -> str | None:
    try:
        return env.anchor()
    except NotImplementedError:
        return None
    except Exception as e:  # noqa: BLE001 - ends only this episode
        raise EnvFault(f"anchor failed: {type(e).__name__}: {e}") from e


def _task_key(env: Env) -> str | None:
    """``env.task_key()``, or None when the env gives none (or fails to: that never fails the episode)."""
    try:
        return env.task_key()
    except Exception:  # noqa: BLE001 - NotImplementedError, or an env bug; the key is optional
        return None
