"""An env pool: the run's envs live in Ray actor processes, and the training process holds :class:`RemoteEnv` proxies.

In the training process a computing env's ``step`` runs inline (holding the GIL while the engine waits) and a
``blocking_io`` env's step runs in a daemon thread that cannot be stopped. With ``scale.env_actors = N`` the envs run
in ``N`` Ray actors (:class:`EnvHost`) instead. Each actor builds its envs from the same factories the single process
uses (``turnrl.build.env_factories``, pickled to the actor), so task keys, anchors and rewards are the in-process ones.
A :class:`RemoteEnv` is an :class:`~turnrl.envs.base.Env`: ``areset``/``astep`` await the actor's ``ObjectRef``, so
the collector's episodes step concurrently while the engine generates; the synchronous ``reset``/``step``/``solve``/
``render`` wait for it (``ray.get``). The anchor and the task key are computed in the actor right after each reset and
step and returned with it, so the collector's per-turn ``anchor()`` costs no round trip.

Placement: a new env goes to the actor hosting the fewest open envs (so with ``N`` at least the number of episodes in
flight, each episode has its own process). An actor is an async actor: a coroutine env (a network wait) or a
``blocking_io`` env overlaps with the other envs of its actor; a computing env's steps run one at a time per actor.

Faults: a call on an actor that died (``ray.kill``, ``kill -9``, out of memory) raises :class:`EnvActorError` naming
the actor; the collector ends that episode as ``Termination.ENV_ERROR`` and the pool replaces the actor, so the next
episodes run. A call the collector abandons (``env.step_timeout_s`` expired, or the collection was cancelled) takes its
actor down too: a stuck step cannot be stopped otherwise, and killing the process frees what it held; the other envs
that actor hosted end as env errors at their next call. ``close`` is sent without waiting for it: a failing ``close``
is logged in the actor's log, not recorded in the trajectory.

For measuring the pool, :func:`busy_env` is any registered env whose every step first computes for ``busy_ms``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

from turnrl.config import Config, ConfigError
from turnrl.envs import Env, Wrapper
from turnrl.envs.multiagent import MultiAgentEnv
from turnrl.scale.latency import slow_env

try:
    import ray
    from ray.exceptions import RayActorError, RayTaskError
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("scale.env_actors > 0 needs Ray: pip install 'turnrl[scale]'") from e

#: What a reset or step answers with: ``(the env's reply, outcome of anchor(), outcome of task_key())``, where an
#: outcome is ``(value, None)`` or ``(None, the exception it raised)``.
Outcome = tuple[Any, BaseException | None]


class EnvActorError(RuntimeError):
    """The env actor hosting an env died; the message names the actor and what to do."""


def _outcome(fn: Callable[[], Any]) -> Outcome:
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001 - handed to the training process, raised there if it asks
        return None, e


class EnvHost:
    """A Ray actor's state: envs built by ``factories[i]``, by the id their :class:`RemoteEnv` gave them."""

    def __init__(self, factories: Sequence[Callable[[], Env]]) -> None:
        self.factories = list(factories)
        self.envs: dict[int, Env] = {}

    def describe(self, factory: int) -> tuple[str, list[tuple[str, str]], int]:
        """``(instructions, examples(), max_actions_per_turn)`` of factory ``factory``'s envs (one env built, closed)."""
        env = self.factories[factory]()
        try:
            return env.instructions, env.examples(), env.max_actions_per_turn
        finally:
            env.close()

    async def reset(self, key: int, factory: int, seed: int | None, options: dict[str, Any] | None
                    ) -> tuple[Any, Outcome, Outcome]:
        """Reset env ``key`` (built by ``factories[factory]`` on first use); its reply, anchor and task key."""
        if key not in self.envs:
            self.envs[key] = self.factories[factory]()
        env = self.envs[key]
        reply = await env.areset(seed=seed, options=options)
        return reply, _outcome(env.anchor), _outcome(env.task_key)

    async def step(self, key: int, action_text: str) -> tuple[Any, Outcome]:
        """Step env ``key``; its reply and the anchor of the state it reached."""
        env = self.envs[key]
        reply = await env.astep(action_text)
        return reply, _outcome(env.anchor)

    def call(self, key: int, method: str) -> Any:
        """``env.<method>()`` of env ``key`` (``solve``, ``render``)."""
        return getattr(self.envs[key], method)()

    def close(self, key: int) -> None:
        env = self.envs.pop(key, None)
        if env is not None:
            env.close()


class EnvPool:
    """``actors`` Ray actors hosting the envs of ``factories``; starts Ray locally unless it is already running.

    :meth:`factory` gives the env factory of the training process: each env it builds is a :class:`RemoteEnv` placed
    on the least loaded actor. ``restarts`` counts actors replaced after dying or being retired by a timeout.
    """

    def __init__(self, actors: int, factories: Sequence[Callable[[], Env]]) -> None:
        if actors < 1:
            raise ValueError(f"an env pool needs at least one actor, got scale.env_actors={actors}")
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        self._factories = list(factories)
        self._actor = ray.remote(EnvHost)
        self.actors = [self._actor.remote(self._factories) for _ in range(actors)]
        self.load = [0] * actors  # open envs per actor
        self.restarts = 0
        self.keys = itertools.count()  # an id for each env, unique in the pool
        self.described = [ray.get(self.actors[0].describe.remote(i)) for i in range(len(self._factories))]

    def factory(self, index: int) -> Callable[[], RemoteEnv]:
        """The factory of :class:`RemoteEnv` proxies to envs built by ``factories[index]`` in the actors."""
        return functools.partial(RemoteEnv, self, index)

    def place(self) -> int:
        """The index of the actor hosting the fewest open envs; it now hosts one more."""
        slot = min(range(len(self.actors)), key=self.load.__getitem__)
        self.load[slot] += 1
        return slot

    def release(self, slot: int, actor) -> None:
        """An env on ``actor`` (at ``slot`` when placed) closed."""
        if slot < len(self.actors) and self.actors[slot] is actor:  # not replaced, nor the pool closed
            self.load[slot] -= 1

    def replace(self, slot: int, actor) -> None:
        """Kill ``actor`` and start a fresh one in its slot, unless that was done already."""
        if self.actors[slot] is not actor:
            return
        ray.kill(actor, no_restart=True)  # a dead actor ignores this; a stuck one is stopped by it
        self.actors[slot] = self._actor.remote(self._factories)
        self.load[slot] = 0
        self.restarts += 1

    def close(self) -> None:
        """Stop every actor (and the envs in them)."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors, self.load = [], []


class RemoteEnv(Env):
    """An env living in one of an :class:`EnvPool`'s actors, seen from the training process (module docstring)."""

    def __init__(self, pool: EnvPool, factory: int) -> None:
        self.pool, self.factory = pool, factory
        self.instructions, self._examples, self.max_actions_per_turn = pool.described[factory]
        self.slot = pool.place()
        self.actor = pool.actors[self.slot]
        self.key = next(pool.keys)
        self._anchor: Outcome = (None, RuntimeError("anchor() before reset(): the state is drawn by reset"))
        self._task_key: Outcome = (None, RuntimeError("task_key() before reset(): the task is drawn by reset"))
        self._closed = False

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        reply, self._anchor, self._task_key = await self._await(self._reset_ref(seed, options), "reset")
        return reply

    async def astep(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        reply, self._anchor = await self._await(self.actor.step.remote(self.key, action_text), "step")
        return reply

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        reply, self._anchor, self._task_key = self._get(self._reset_ref(seed, options), "reset")
        return reply

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        reply, self._anchor = self._get(self.actor.step.remote(self.key, action_text), "step")
        return reply

    def anchor(self) -> str:
        return _value(self._anchor)

    def task_key(self) -> str:
        return _value(self._task_key)

    def solve(self) -> list[str] | None:
        return self._get(self.actor.call.remote(self.key, "solve"), "solve")

    def render(self) -> str:
        return self._get(self.actor.call.remote(self.key, "render"), "render")

    def examples(self) -> list[tuple[str, str]]:
        return self._examples

    def close(self) -> None:
        """Close the env in its actor without waiting (a dead actor's envs are gone already)."""
        if not self._closed:
            self._closed = True
            self.actor.close.remote(self.key)
            self.pool.release(self.slot, self.actor)

    def _reset_ref(self, seed: int | None, options: dict[str, Any] | None):
        return self.actor.reset.remote(self.key, self.factory, seed, options)

    async def _await(self, ref, what: str) -> Any:
        """The actor's answer to ``ref``; abandoning it (a timeout, a cancelled collection) retires the actor."""
        try:
            return await ref
        except asyncio.CancelledError:
            self.pool.replace(self.slot, self.actor)
            raise
        except (RayActorError, RayTaskError) as e:
            raise self._error(e, what) from None

    def _get(self, ref, what: str) -> Any:
        try:
            return ray.get(ref)
        except (RayActorError, RayTaskError) as e:
            raise self._error(e, what) from None

    def _error(self, e: RayActorError | RayTaskError, what: str) -> BaseException:
        """The env's own exception, or an :class:`EnvActorError` when its actor died (which is then replaced)."""
        if isinstance(e, RayTaskError):
            return e.cause if isinstance(e.cause, BaseException) else RuntimeError(str(e))
        self.pool.replace(self.slot, self.actor)
        return EnvActorError(
            f"env actor {self.slot} died during {what} ({type(e).__name__}); this episode ends and the pool started a "
            "replacement for the next ones. If actors keep dying, look at the env's memory use and the actor's log "
            "(ray logs), or set scale.env_actors=0 to run the envs in the training process")


def pooled_factories(cfg: Config, envs: Callable[[], Env], eval_envs: Callable[[], Env] | None
                     ) -> tuple[Callable[[], Env], Callable[[], Env] | None]:
    """The run's training (and evaluation) env factories, ``turnrl.build.env_factories``', as factories of proxies to
    envs built in ``scale.env_actors`` actors; :class:`ConfigError` for what the actors cannot carry."""
    n = cfg.scale.env_actors
    if cfg.scale.workers:
        raise ConfigError(f"scale.env_actors={n} moves the training process's envs into actors, but rollout workers "
                          f"(scale.workers={cfg.scale.workers}) already step their own envs outside it: set one of them to 0")
    if cfg.experience.retrieve or cfg.experience.skills or cfg.curriculum.enabled:  # what the driver learns would not reach the actors
        raise ConfigError(f"scale.env_actors={n} does not carry the experience/skill libraries or the curriculum's level "
                          "to the env actors: set scale.env_actors=0, or turn them off")
    probe = envs()
    probe.close()
    if isinstance(probe, MultiAgentEnv):
        raise ConfigError(f"{cfg.env.id} is multi-agent, whose envs run in the training process only: set scale.env_actors=0")
    pool = EnvPool(n, [f for f in (envs, eval_envs) if f is not None])
    return pool.factory(0), pool.factory(1) if eval_envs is not None else None


def _value(outcome: Outcome) -> Any:
    value, error = outcome
    if error is not None:
        raise error
    return value


class Busy(Wrapper):
    """Computes (a Python loop holding the GIL) for ``seconds`` before each step of the wrapped env."""

    def __init__(self, env: Env, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"busy_ms={seconds * 1000:g} must be >= 0")
        super().__init__(env)
        self.seconds = seconds

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return super().step(action_text)

    async def astep(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self.step(action_text)


def busy_env(env: str = "frozenlake-v0", busy_ms: float = 50.0, **kwargs: Any) -> Env:
    """The registered env ``env`` built with ``kwargs`` (its own class: ``make`` adds the standard wrappers around
    this), each step first computing for ``busy_ms`` (``env.id: turnrl.scale.envpool:busy_env``)."""
    return Busy(slow_env(env, latency_ms=0.0, **kwargs).unwrapped, busy_ms / 1000)
