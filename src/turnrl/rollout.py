"""The collector: drives (tasks x group size) episodes against an engine, concurrently, turn by turn.

With a plain engine, all live episodes advance in lock step: one batched ``engine.generate`` call per
turn for every episode still running, then every env's ``astep`` awaited together (so envs that wait on
a network or a subprocess overlap). With a :class:`~turnrl.engines.base.SessionEngine` (such as
:class:`~turnrl.engines.native.NativeEngine`), each episode is a coroutine holding one engine
sequence for its lifetime: the engine batches whatever turns are in flight (continuous batching) and
keeps each sequence's KV cache between turns. What the model is shown each turn is the context strategy's
(:mod:`turnrl.agent.context`). Trajectories keep the exact token ids the engine conditioned on and produced, the
behaviour logprobs, per-turn reward components, the anchor state each turn acted in, and why the episode
ended. A failing env ends only its own episode (``Termination.ENV_ERROR``), never the batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from turnrl.agent.chat import ChatRenderer
from turnrl.agent.context import ContextSpec, EpisodeContext
from turnrl.engines.base import Engine, SamplingParams, SessionEngine
from turnrl.envs.base import Env
from turnrl.types import Termination, Trajectory, TrajectoryGroup, Turn


@dataclass
class _Episode:
    env: Env
    traj: Trajectory
    context: EpisodeContext
    index: int = 0  # position within its group


@dataclass
class RolloutStats:
    generate_s: float = 0.0
    env_s: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0


class Collector:
    """Runs episodes of envs built by ``env_factory`` against ``engine``."""

    def __init__(self, engine: Engine, tokenizer, env_factory: Callable[[], Env], context: ContextSpec = ContextSpec()):
        self.engine = engine
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.context = context
        self._renderer: ChatRenderer | None = None
        self.stats = RolloutStats()

    def renderer(self, env: Env) -> ChatRenderer:
        if self._renderer is None:
            self._renderer = ChatRenderer(self.tokenizer, env.instructions, env.examples(), few_shot=self.context.few_shot)
        return self._renderer

    def collect(self, seeds: Sequence[int], group_size: int, sampling: SamplingParams, env_id: str = "") -> list[TrajectoryGroup]:
        """Roll out ``group_size`` episodes for each seed; returns one group per seed, in seed order."""
        return asyncio.run(self._collect(list(seeds), group_size, sampling, env_id))

    async def _collect(self, seeds: list[int], group_size: int, sampling: SamplingParams, env_id: str) -> list[TrajectoryGroup]:
        self.stats = RolloutStats()
        groups = [TrajectoryGroup(env_id=env_id, seed=s) for s in seeds]
        episodes: list[_Episode] = []
        pairs = [(g, s) for g, s in enumerate(seeds) for _ in range(group_size)]
        envs = [self.env_factory() for _ in pairs]
        resets = await asyncio.gather(*(env.areset(seed=s) for env, (_, s) in zip(envs, pairs)), return_exceptions=True)
        for env, (g, s), res in zip(envs, pairs, resets):
            traj = Trajectory(env_id=env_id, seed=s, group_index=g, policy_version=self.engine.version, context=self.context.strategy)
            groups[g].trajectories.append(traj)
            if isinstance(res, BaseException):
                traj.termination, traj.error = Termination.ENV_ERROR, f"reset failed: {type(res).__name__}: {res}"
                env.close()
                continue
            context = EpisodeContext(self.context, self.renderer(env), observation=res[0])
            episodes.append(_Episode(env, traj, context, index=len(groups[g].trajectories) - 1))

        if isinstance(self.engine, SessionEngine):  # continuous batching, caches kept across turns
            t0 = time.perf_counter()
            await asyncio.gather(*(self._episode(ep, sampling) for ep in episodes))
            self.stats.generate_s = time.perf_counter() - t0 - self.stats.env_s  # wall time, not the sum over episodes
        else:
            live = episodes
            while live:
                live = await self._turn(live, sampling)
        return groups

    async def _turn(self, live: list[_Episode], sampling: SamplingParams) -> list[_Episode]:
        prompts, runnable = [], []
        for ep in live:
            ids = ep.context.prompt()
            if len(ids) + sampling.max_new_tokens > self.context.max_context_tokens:
                self._finish(ep, Termination.TRUNCATED_CONTEXT)
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

        texts = [self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
        anchors = [_anchor(ep.env) for ep in runnable]
        t0 = time.perf_counter()
        results = await asyncio.gather(*(ep.env.astep(text) for ep, text in zip(runnable, texts)), return_exceptions=True)
        self.stats.env_s += time.perf_counter() - t0

        return [
            ep for ep, ids, comp, text, anchor, res in zip(runnable, prompts, completions, texts, anchors, results)
            if self._record(ep, ids, comp, text, anchor, res)
        ]

    async def _episode(self, ep: _Episode, sampling: SamplingParams) -> None:
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
                    self._finish(ep, Termination.TRUNCATED_CONTEXT)
                    return
                t0 = time.perf_counter()
                comp = await engine.agenerate(seq, ids, sampling)
                self.stats.generate_s += time.perf_counter() - t0
                self.stats.prompt_tokens += len(ids)
                self.stats.generated_tokens += len(comp.token_ids)
                text = self.tokenizer.decode(comp.token_ids, skip_special_tokens=True)
                anchor = _anchor(ep.env)
                t0 = time.perf_counter()
                try:
                    res = await ep.env.astep(text)
                except Exception as e:  # noqa: BLE001 - an env failure ends only this episode
                    res = e
                self.stats.env_s += time.perf_counter() - t0
                if not self._record(ep, ids, comp, text, anchor, res):
                    return
        finally:
            engine.close(seq)

    def _record(self, ep: _Episode, ids: list[int], comp, text: str, anchor, res) -> bool:
        """Append the turn to the trajectory; return whether the episode goes on."""
        turn = Turn(
            prompt_ids=ep.context.turn_prompt_ids(ids),
            response_ids=list(comp.token_ids),
            logprobs=list(comp.logprobs),
            observation=ep.context.observation,
            response_text=text,
            anchor=anchor,
            finish_reason=comp.finish_reason,
        )
        ep.traj.turns.append(turn)
        ep.traj.policy_version = comp.version
        if isinstance(res, BaseException):
            turn.valid = False
            ep.traj.error = f"step failed: {type(res).__name__}: {res}"
            self._finish(ep, Termination.ENV_ERROR)
            return False
        obs, reward, terminated, truncated, info = res
        turn.reward = float(reward)
        turn.reward_components = dict(info.get("reward_components", {"reward": float(reward)}))
        turn.actions = list(info.get("actions", []))
        turn.valid = bool(info.get("valid", True))
        turn.info = {k: v for k, v in info.items() if k not in ("reward_components", "actions", "valid")}
        ep.traj.success = bool(info.get("success", False))
        if terminated:
            self._finish(ep, Termination.TERMINATED)
            return False
        if truncated:
            self._finish(ep, Termination.TRUNCATED_CONTEXT if info.get("truncation") == "context" else Termination.TRUNCATED_TURNS)
            return False
        ep.context.advance(turn.response_ids, text, obs, self.tokenizer.eos_token_id)
        return True

    def _finish(self, ep: _Episode, why: Termination) -> None:
        ep.traj.termination = why
        ep.env.close()


def _anchor(env: Env) -> str | None:
    try:
        return env.anchor()
    except NotImplementedError:
        return None
