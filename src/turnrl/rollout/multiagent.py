"""The multi-agent collector: one shared model plays every role of a :class:`~turnrl.envs.multiagent.MultiAgentEnv`,
each role in its own context, and each role's turns become its own :class:`~turnrl.types.Trajectory`.

Per-role policies (``multiagent.policies=per_role``): when the collector's engine is a :class:`RoleEngines`, each
role is played by its own engine (its own weights) instead; everything else below holds unchanged. An
:class:`EpisodeEngines` makes each episode's role an engine of its own when the episode starts: :func:`scripted` players
that read the env (a team of oracles for demonstrations, a fixed rule as a self-play opponent).

Role prompts: a role's context is an :class:`~turnrl.agent.context.EpisodeContext` whose renderer has the role's
system prompt (``env.role_instructions[role]``) and the role's few-shot examples, so the shared model knows which
agent it is from its prompt alone. Token-in, token-out holds per role: a turn's ids are exactly what the engine
conditioned on and produced *for that role*; the other roles' responses reach it only as observation text the env
wrote (a message, a move), never as their tokens.

Lock step: each joint step, every live episode asks its env which roles act; their prompts go to the engines one
batch per engine and role (a role a :class:`Lineup` gives to another engine, such as a frozen self-play opponent, is
generated there and not recorded); then every env steps concurrently. A
:class:`~turnrl.engines.base.SessionEngine` (the native engine) holds one session per episode and role, opened when the
role first acts and closed when the episode ends, keyed by (task seed, episode index, role index): it keeps each
role's KV cache between turns, so a role's system prompt and examples (``per_step``) or its whole conversation
(``full``) are computed once per episode, not every turn, and what a role samples does not depend on its batch.
Other engines get one batched ``generate`` per engine and role. A role's context is opened
when the role first acts, on the newest observation it has then, and advances lazily: its response and the newest
observation the env gave it are appended only when it acts again, so observations it got while others acted
collapse into the newest (the contract: it answers its newest one).

Rewards: a reward paid to a role is added to its latest turn (a role that never acted has no turn to credit). An
episode ends when no role acts any more; every recorded trajectory then gets ``team_return``, the mean over all the
episode's roles of their summed rewards. A failing env (reset or step raising, timing out, answering in the wrong
shape) ends all of its episode's trajectories as ``Termination.ENV_ERROR``.

Output of :meth:`MultiAgentCollector.collect`: for each seed in order, one :class:`~turnrl.types.TrajectoryGroup`
per recorded role in ``env.roles`` order, each holding that role's ``group_size`` trajectories in episode order;
so every group compares copies of one role on one task, and every estimator gives each agent a baseline of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from turnrl.agent.chat import ChatRenderer
from turnrl.agent.context import ContextSpec, EpisodeContext
from turnrl.engines.base import Completion, Engine, SamplingParams, SessionEngine, written
from turnrl.envs.multiagent import MultiAgentEnv, MultiStep
from turnrl.rollout.collector import Collector, EnvFault, _run
from turnrl.types import Termination, Trajectory, TrajectoryGroup, Turn


class Lineup(Protocol):
    """Which engine plays each role of a task: roles it returns are played by those engines (an :class:`EpisodeEngines`
    makes one for each episode) and not recorded; every other role is played by the collector's engine and recorded
    (trained on)."""

    def opponents(self, seed: int, roles: Sequence[str]) -> Mapping[str, Engine | EpisodeEngines]: ...


class RoleEngines:
    """The engines of per-role policies, one per role, as the run's one engine: the multi-agent collector plays role
    ``r`` with ``engines[r]``, and :meth:`sync_weights` / :meth:`state_dict` cover every one. It does not generate
    itself. The engines are synced together, so they share one ``version``."""

    def __init__(self, engines: Mapping[str, Engine]) -> None:
        self.engines = dict(engines)

    @property
    def version(self) -> int:
        return min(engine.version for engine in self.engines.values())

    def sync_weights(self) -> None:
        for engine in self.engines.values():
            engine.sync_weights()

    def state_dict(self) -> dict[str, dict]:
        return {role: engine.state_dict() for role, engine in self.engines.items()}

    def load_state_dict(self, state: Mapping[str, dict]) -> None:
        for role, engine in self.engines.items():
            engine.load_state_dict(state[role])


class EpisodeEngines:
    """An engine made for each episode and role when the episode starts, as the run's one engine: ``make(env, role)``
    returns the engine that plays ``role`` in the episode of ``env`` (a scripted player that reads the env, such as the
    oracle team whose episodes ``turnrl sft`` records). It does not generate itself; its ``version`` is recorded."""

    def __init__(self, make: Callable[[MultiAgentEnv, str], Engine], version: int = 0) -> None:
        self.make, self.version = make, version


class ScriptedRole:
    """Plays one role of one episode with a function of the env: each turn, ``act()`` (the env's ``oracle(role)`` or
    ``rule(role)`` now) written as the model would write it (:func:`~turnrl.engines.base.written`)."""

    def __init__(self, tokenizer, act: Callable[[], str], version: int = 0) -> None:
        self.tokenizer, self.act, self.version = tokenizer, act, version

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        return [written(self.tokenizer, self.act(), params, self.version) for _ in prompts]


SCRIPTED = ("oracle", "rule")  # the MultiAgentEnv methods a scripted player answers with


def scripted(tokenizer, player: str) -> EpisodeEngines:
    """Every role of every episode played by the env's ``player`` method (``"oracle"``: a perfect agent;
    ``"rule"``: the simple fixed rule), each role in its own context like the model."""
    if player not in SCRIPTED:
        raise ValueError(f"unknown scripted player {player!r}; valid: {', '.join(SCRIPTED)}")
    return EpisodeEngines(lambda env, role: ScriptedRole(tokenizer, lambda: getattr(env, player)(role)))  # type: ignore[arg-type]


def _for_episode(engine: Engine | EpisodeEngines, env: MultiAgentEnv, role: str) -> Engine:
    """The engine that plays ``role`` in ``env``'s episode: made for it by an :class:`EpisodeEngines`, else ``engine``."""
    return engine.make(env, role) if isinstance(engine, EpisodeEngines) else engine


def role_metrics(groups: Sequence[TrajectoryGroup], prefix: str) -> dict[str, float]:
    """``<prefix>/success_rate/<role>`` and ``<prefix>/return/<role>`` (mean summed reward) over each role's
    trajectories; empty when no trajectory has a role (a single-agent env)."""
    by_role: dict[str, list[Trajectory]] = {}
    for traj in (t for g in groups for t in g.trajectories):
        if traj.agent is not None:
            by_role.setdefault(traj.agent, []).append(traj)
    out = {}
    for role, trajs in by_role.items():
        out[f"{prefix}/success_rate/{role}"] = sum(t.success for t in trajs) / len(trajs)
        out[f"{prefix}/return/{role}"] = sum(t.total_reward for t in trajs) / len(trajs)
    return out


@dataclass
class _Agent:
    """One role in one episode: who plays it, its trajectory (None: an opponent's, not recorded) and its context."""

    renderer: ChatRenderer
    engine: Engine
    traj: Trajectory | None
    context: EpisodeContext | None = None  # opened when the role first acts, on the newest observation it has then
    returns: float = 0.0
    last_turn: Turn | None = None
    pending: tuple[list[int], str] | None = None  # (response ids, text) the env has answered, not yet in the context
    observation: str = ""  # the newest observation the env gave this role
    done: bool = False
    session: int | None = None  # its engine's session, when the engine has sessions


@dataclass
class _Episode:
    env: MultiAgentEnv
    seed: int = 0
    index: int = 0  # position within its group
    agents: dict[str, _Agent] = field(default_factory=dict)
    ended: bool = False


class MultiAgentCollector(Collector):
    """Runs episodes of multi-agent envs built by ``env_factory`` (module docstring).

    ``lineup`` gives roles of each task to other engines (self-play opponents); None: ``engine`` plays every role
    (a :class:`RoleEngines`: each role's own engine plays it).
    """

    def __init__(self, engine: Engine | RoleEngines, tokenizer, env_factory: Callable[[], MultiAgentEnv],
                 context: ContextSpec = ContextSpec(), *, step_timeout_s: float = 60.0, lineup: Lineup | None = None) -> None:
        super().__init__(engine, tokenizer, env_factory, context, step_timeout_s=step_timeout_s)  # type: ignore[arg-type]
        self.lineup = lineup
        self._renderers: dict[str, ChatRenderer] = {}

    def role_renderer(self, env: MultiAgentEnv, role: str) -> ChatRenderer:
        """The renderer of ``role``: its system prompt and few-shot examples (built once per role)."""
        if role not in self._renderers:
            self._renderers[role] = ChatRenderer(self.tokenizer, env.role_instructions[role], env.examples(role),
                                                 few_shot=self.context.few_shot)
        return self._renderers[role]

    def collect(self, seeds: Sequence[int], group_size: int, sampling: SamplingParams, env_id: str = "") -> list[TrajectoryGroup]:
        """Roll out ``group_size`` episodes per seed; one group per (seed, recorded role), seeds in order."""
        return _run(self._collect_all(list(seeds), group_size, sampling, env_id))

    async def _collect_all(self, seeds: list[int], group_size: int, sampling: SamplingParams, env_id: str) -> list[TrajectoryGroup]:
        groups: list[TrajectoryGroup] = []
        starts = []
        for seed in seeds:
            env = self.env_factory()
            opponents = dict(self.lineup.opponents(seed, env.roles)) if self.lineup else {}
            by_role = {role: TrajectoryGroup(env_id=env_id, seed=seed) for role in env.roles if role not in opponents}
            groups += by_role.values()
            for index in range(group_size):
                starts.append(self._start_episode(env if index == 0 else self.env_factory(), seed, index, by_role, opponents,
                                                  env_id))
        live = [ep for ep in await asyncio.gather(*starts) if ep is not None]
        for gi, g in enumerate(groups):
            for t in g.trajectories:
                t.group_index = gi
        episodes = list(live)
        try:
            while live:
                live = await self._joint_step(live, sampling)
        finally:  # an engine error ends the collection: free the sessions of the episodes it cut short
            for ep in episodes:
                _close_sessions(ep)
        return groups

    async def _start_episode(self, env: MultiAgentEnv, seed: int, index: int, groups: dict[str, TrajectoryGroup],
                             opponents: Mapping[str, Engine], env_id: str) -> _Episode | None:
        """Reset ``env`` and open a context per role; None when the reset failed (its trajectories end as env errors)."""
        ep = _Episode(env, seed, index)
        trajs = {}
        for role, group in groups.items():
            trajs[role] = Trajectory(env_id=env_id, seed=seed, policy_version=self.engine.version, context=self.context.strategy,
                                     agent=role)
            group.trajectories.append(trajs[role])
        try:
            observations, _ = await self._env_call("reset", env.areset(seed=seed))
            if not isinstance(observations, dict) or set(observations) != set(env.roles):
                raise EnvFault(f"reset returned {type(observations).__name__} observations, not one per role {list(env.roles)}")
            for role in env.roles:
                engine = _for_episode(opponents[role], env, role) if role in opponents else self._engine_of(role, env)
                ep.agents[role] = _Agent(self.role_renderer(env, role), engine, trajs.get(role),
                                         observation=_text(observations[role]))
            key = env.task_key()
        except Exception as e:  # noqa: BLE001 - an env fault or task_key failing ends only this episode
            self._finish(ep, Termination.ENV_ERROR, str(e), list(trajs.values()))
            return None
        for traj in trajs.values():
            traj.task_key = key
        return ep

    def _engine_of(self, role: str, env: MultiAgentEnv) -> Engine:
        """The engine that plays a recorded ``role`` in ``env``'s episode: its own under per-role policies, one made
        for the episode by :class:`EpisodeEngines`, else the collector's."""
        if isinstance(self.engine, RoleEngines):
            return self.engine.engines[role]
        return _for_episode(self.engine, env, role)

    async def _joint_step(self, live: list[_Episode], sampling: SamplingParams) -> list[_Episode]:
        """One joint step of every live episode: batched generation per engine, then every env steps concurrently."""
        requests: list[tuple[_Episode, str, list[int]]] = []
        for ep in live:
            for role in ep.env.acting():
                ids = self._prompt(ep.agents[role])
                if len(ids) + sampling.max_new_tokens > self.context.max_context_tokens:
                    self._finish(ep, Termination.TRUNCATED_CONTEXT)
                    break
                requests.append((ep, role, ids))
        requests = [r for r in requests if not r[0].ended]
        completions = await self._generate(requests, sampling)
        actions: dict[int, dict[str, tuple[list[int], Completion]]] = {}
        for (ep, role, ids), comp in zip(requests, completions):
            actions.setdefault(id(ep), {})[role] = (ids, comp)
        stepping = [ep for ep in live if id(ep) in actions]
        t0 = time.perf_counter()
        going_on = await asyncio.gather(*(self._act(ep, actions[id(ep)]) for ep in stepping))
        self.stats.env_s += time.perf_counter() - t0
        return [ep for ep, more in zip(stepping, going_on) if more]

    def _prompt(self, agent: _Agent) -> list[int]:
        """The role's next prompt: its context opened on its newest observation when it first acts, else its answered
        response and the newest observation appended."""
        if agent.context is None:
            agent.context = EpisodeContext(self.context, agent.renderer, agent.observation)
        elif agent.pending is not None:
            ids, text = agent.pending
            agent.context.advance(ids, text, agent.observation, self.tokenizer.eos_token_id)
            agent.pending = None
        return agent.context.prompt()

    async def _generate(self, requests: list[tuple[_Episode, str, list[int]]], sampling: SamplingParams) -> list[Completion]:
        """Completions of ``requests`` in order: one batch per engine and role, in a session per episode and role
        where the engine has sessions. A role's fresh prompts share its system prompt and examples, so an engine with
        a prefix store computes that head once for them (mixing the roles would leave almost no common head): while
        some session is new the batches go one after another; once every session holds its head they go together,
        so the roles decode in the same engine passes."""
        out: dict[int, Completion] = {}
        batches: dict[tuple[int, str], list[int]] = {}
        for i, (ep, role, _) in enumerate(requests):
            batches.setdefault((id(ep.agents[role].engine), role), []).append(i)

        async def batch(indices: list[int]) -> None:
            first_ep, role, _ = requests[indices[0]]
            engine = first_ep.agents[role].engine
            prompts = [requests[i][2] for i in indices]
            if isinstance(engine, SessionEngine):
                completions = await asyncio.gather(*(self._in_session(requests[i][0], role, requests[i][2], sampling)
                                                     for i in indices))
            else:
                completions = engine.generate(prompts, sampling)
            for i, comp in zip(indices, completions):
                out[i] = comp
            self.stats.prompt_tokens += sum(len(p) for p in prompts)
            self.stats.generated_tokens += sum(len(out[i].token_ids) for i in indices)

        t0 = time.perf_counter()
        if any(ep.agents[role].session is None and isinstance(ep.agents[role].engine, SessionEngine) for ep, role, _ in requests):
            for indices in batches.values():
                await batch(indices)
        else:
            await asyncio.gather(*(batch(indices) for indices in batches.values()))
        self.stats.generate_s += time.perf_counter() - t0
        return [out[i] for i in range(len(requests))]

    async def _in_session(self, ep: _Episode, role: str, prompt: list[int], sampling: SamplingParams) -> Completion:
        """``prompt`` completed in the session of ``role`` in ``ep`` (opened on its first turn)."""
        agent = ep.agents[role]
        engine: SessionEngine = agent.engine  # type: ignore[assignment]
        if agent.session is None:
            agent.session = engine.open(sample_key=(ep.seed, ep.index, ep.env.roles.index(role)))
        return await engine.agenerate(agent.session, prompt, sampling)

    async def _act(self, ep: _Episode, responses: dict[str, tuple[list[int], Completion]]) -> bool:
        """Step the env with every acting role's response and record the turns; returns whether the episode goes on."""
        texts = {}
        for role, (ids, comp) in responses.items():
            agent = ep.agents[role]
            texts[role] = self.tokenizer.decode(comp.token_ids, skip_special_tokens=True)
            agent.pending = (list(comp.token_ids), texts[role])
            agent.last_turn = Turn(prompt_ids=agent.context.turn_prompt_ids(ids), response_ids=list(comp.token_ids),
                                   logprobs=list(comp.logprobs), observation=agent.context.observation, response_text=texts[role],
                                   finish_reason=comp.finish_reason, version=comp.version)
            if agent.traj is not None:
                agent.traj.turns.append(agent.last_turn)
                agent.traj.policy_version = comp.version
        try:
            for role in responses:
                ep.agents[role].last_turn.anchor = ep.env.anchor(role)  # type: ignore[union-attr]
            out = await self._env_call("step", ep.env.astep(texts))
            if not isinstance(out, MultiStep):
                raise EnvFault(f"step returned a {type(out).__name__}, not a MultiStep")
            self._apply(ep, responses, out)
        except Exception as e:  # noqa: BLE001 - an env fault or a malformed step ends only this episode
            for role in responses:
                ep.agents[role].last_turn.valid = False  # type: ignore[union-attr]
            self._finish(ep, Termination.ENV_ERROR, str(e))
            return False
        if not ep.env.acting() or all(a.done for a in ep.agents.values()):
            self._finish(ep, None)
            return False
        return True

    def _apply(self, ep: _Episode, acted: Mapping[str, object], out: MultiStep) -> None:
        """Record a step's rewards, validity, successes, endings and observations on every role."""
        for role, agent in ep.agents.items():
            info = dict(out.infos[role])
            reward = float(out.rewards[role])
            agent.returns += reward
            turn = agent.last_turn
            if turn is not None:
                turn.reward += reward
                for name, value in info.pop("reward_components", {"reward": reward}).items():
                    turn.reward_components[name] = turn.reward_components.get(name, 0.0) + float(value)
                if role in acted:
                    turn.actions = list(info.pop("actions", []))
                    turn.valid = bool(info.pop("valid", True))
                    turn.info = {k: v for k, v in info.items() if k != "success"} | turn.info
            if agent.traj is not None:
                agent.traj.success = bool(info.get("success", False))
            if role in out.observations:
                agent.observation = _text(out.observations[role])
            if not agent.done and (out.terminated[role] or out.truncated[role]):
                agent.done = True
                if agent.traj is not None:
                    agent.traj.termination = _ending(out.terminated[role], info)

    def _finish(self, ep: _Episode, why: Termination | None, error: str | None = None,
                trajs: Sequence[Trajectory] = ()) -> None:
        """End the episode: roles still going end as ``why`` (None: as each already ended), the team return is set
        on every recorded trajectory, and the env is closed (a failing close is recorded on them)."""
        trajs = list(trajs) or [a.traj for a in ep.agents.values() if a.traj is not None]
        team = sum(a.returns for a in ep.agents.values()) / max(1, len(ep.agents))
        for agent in ep.agents.values():
            if agent.traj is not None and why is not None and not agent.done:
                agent.traj.termination = why
            agent.done = True
        for traj in trajs:
            traj.team_return = team
            if why == Termination.ENV_ERROR:
                traj.termination, traj.error = why, error
        _close_sessions(ep)
        try:
            ep.env.close()
        except Exception as e:  # noqa: BLE001 - the episode already ended
            for traj in trajs:
                traj.error = "; ".join(filter(None, [traj.error, f"close failed: {type(e).__name__}: {e}"]))
        ep.ended = True


def _close_sessions(ep: _Episode) -> None:
    """Close the engine sessions of ``ep``'s roles (each once)."""
    for agent in ep.agents.values():
        if agent.session is not None:
            agent.engine.close(agent.session)  # type: ignore[attr-defined]
            agent.session = None


def _ending(terminated: bool, info: Mapping[str, object]) -> Termination:
    if terminated:
        return Termination.TERMINATED
    return Termination.TRUNCATED_CONTEXT if info.get("truncation") == "context" else Termination.TRUNCATED_TURNS


def _text(observation: object) -> str:
    if not isinstance(observation, str):
        raise EnvFault(f"the env gave a {type(observation).__name__} observation; an observation is str")
    return observation
