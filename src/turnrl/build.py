"""Config -> components: the envs and their held-out split, the model, the engine, the collectors, the learner;
and saving / restoring a run's components in a checkpoint.

``turnrl train``, ``turnrl eval`` and the Python API build a run here and nowhere else. Every env id and
keyword is tried once before anything big loads, so a typo fails in a second with the env's own message.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import random
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from turnrl import checkpoint
from turnrl.agent.context import ContextSpec
from turnrl.agent.memory import MemoryActions
from turnrl.agent.demos import read_demos
from turnrl.agent.experience import ExperienceLibrary, agent_libraries, with_libraries
from turnrl.agent.skills import SkillLibrary
from turnrl.config import Config, ConfigError
from turnrl.credit import estimator_flag, get_estimator
from turnrl.credit.rewards import RewardShaper
from turnrl.engines import Engine, SamplingParams, make_engine
from turnrl.engines.native import UnsupportedModelError
from turnrl.engines.serve import EngineGate, RolloutServer
from turnrl.engines.sessions import SessionStore
from turnrl.envs import Env, make
from turnrl.learner import Critic, CriticParams, Learner, LearnerParams, build_samples
from turnrl.learner.roles import role_policies
from turnrl.models import frozen_copy, load_model, load_tokenizer, precision_note, use_bf16
from turnrl.models.freeze import freeze_lower_layers
from turnrl.models.recompute import checkpoint_layers, is_checkpointed, wanted as recompute_wanted
from turnrl.models.lora import LoraError, add_lora, is_lora, load_lora, split_adapter_path, trainable_parameters
from turnrl.monitor.card import write_model_card
from turnrl.envs.multiagent import MultiAgentEnv
from turnrl.rollout import Collector
from turnrl.rollout.curriculum import Curriculum, LeveledEnvs, LeveledTasks
from turnrl.rollout.served import ServedCollector
from turnrl.rollout.multiagent import Lineup, MultiAgentCollector
from turnrl.rollout.selfplay import SelfPlay, league
from turnrl.types import Advantages, TrainSample, Trajectory


@dataclass
class Components:
    """Everything a run holds. ``model`` and ``learner`` are None when only evaluating through a remote engine."""

    cfg: Config
    model: Any
    tokenizer: Any
    engine: Engine
    collector: Collector
    learner: Learner | None = None
    shaper: RewardShaper | None = None  # KL-in-reward and running reward normalisation (None when both are off)
    eval_collector: Collector | None = None  # eval.env_id's collector (None: the training collector)
    tasks: TaskSplit | None = None  # which seeds are held out, which are trained on
    demos: list[TrainSample] = field(default_factory=list)  # algo.demo_file's, on training tasks (demo-guided RL)
    selfplay: SelfPlay | None = None  # multiagent.selfplay: the opponent pool and its Elo ratings
    experience: ExperienceLibrary | None = None  # experience.retrieve: past steps shown in observations (docs/experience.md)
    skills: SkillLibrary | None = None  # experience.skills: action sequences offered as `skill NAME`
    curriculum: Curriculum | None = None  # curriculum.enabled: the training tasks' difficulty level (docs/curriculum.md)

    @property
    def libraries(self) -> list[ExperienceLibrary | SkillLibrary]:
        """The enabled agent libraries: each learns from every credited batch (``learn``) and is checkpointed."""
        return [library for library in (self.experience, self.skills) if library is not None]


def build(cfg: Config, model=None, tokenizer=None) -> Components:
    """Model, engine, collectors and learner for training. ``model``/``tokenizer`` override ``cfg.model.path`` (tests)."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    seed_everything(cfg.train.seed)
    experience, skills = agent_libraries(cfg)
    curriculum = Curriculum.from_config(cfg)
    envs, eval_envs = env_factories(cfg, experience, skills, curriculum)
    if cfg.scale.env_actors:  # the envs run in Ray actors, the collectors hold proxies (turnrl.scale.envpool)
        envs, eval_envs = _env_pool(cfg, envs, eval_envs)
    base, adapter = _split_model_path(cfg.model.path)  # an adapter (a LoRA checkpoint): its base model, then it
    with quiet_transformers():
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(base)
        if model is None:
            model = load_model(base, dtype=getattr(torch, cfg.model.dtype))
        if adapter is not None or cfg.lora.enabled:
            model = with_lora(cfg, model, adapter)
    # LoRA: the reference is the policy with its adapters disabled (learner.py), not a copy
    ref = (model if is_lora(model) else frozen_copy(model)) if cfg.model.reference else None
    roles = role_policies(cfg, envs, eval_envs, model, ref, lambda m: _engine(cfg, m, tokenizer), tokenizer.pad_token_id)
    # per_role: the run's model and engine are every role's (turnrl.learner.roles)
    model, engine = (roles.models, roles.engines) if roles else (model, _engine(cfg, model, tokenizer))
    selfplay = _selfplay(cfg, model, tokenizer, envs)
    collector, eval_collector = _collectors(cfg, engine, tokenizer, envs, eval_envs, selfplay)
    if cfg.scale.workers:  # rollouts on Ray actors that build what rollout_parts builds here (turnrl.scale.workers)
        collector, eval_collector = _ray_collectors(cfg, model, tokenizer, engine, eval_envs is not None)
    critic = Critic(model, CriticParams.from_config(cfg), tokenizer.pad_token_id) if cfg.algo.critic != "none" else None
    if roles is None:  # per-role policies froze and checkpointed each role's model before its optimizer
        freeze_lower_layers(model, cfg.train.freeze_layers)  # after the separate critic's copy, before the optimizer
        if recompute_wanted(cfg.train.activation_checkpointing, model):
            checkpoint_layers(model)
    learner = roles.learner if roles else _learner(cfg, model, tokenizer.pad_token_id, ref, critic)
    a = cfg.algo
    shaper = None
    if a.kl_in_reward > 0 or a.reward_norm == "running":
        shaper = RewardShaper(a.kl_in_reward, a.kl_target, a.kl_horizon, normalise=a.reward_norm == "running")
    tasks = TaskSplit(cfg, envs, eval_envs)
    if curriculum is not None:  # one split per level, all holding out the same evaluation tasks
        tasks = LeveledTasks([TaskSplit(cfg, level, eval_envs) for level in envs.factories], curriculum)
    if cfg.serve.train:  # the loop trains on episodes agents play through the rollout service; evaluation stays here
        collector, eval_collector = _served_collector(cfg, engine, tokenizer, tasks), eval_collector or collector
    demos = demo_samples(tasks.training_only(read_demos(a.demo_file, len(tokenizer)))) if a.demo_coef > 0 else []
    return Components(cfg, model, tokenizer, engine, collector, learner, shaper, eval_collector, tasks, demos, selfplay,
                      experience, skills, curriculum)


def build_for_eval(cfg: Config, engine_kind: str, **engine_options: Any) -> Components:
    """Envs, tokenizer and collectors around a vLLM or OpenAI-compatible engine: what evaluation needs, no learner.

    The tokenizer comes from ``model.path`` and must be the served model's (``docs/engines.md``).
    """
    envs, eval_envs = env_factories(cfg)  # fail before contacting a server or loading vLLM
    if cfg.scale.env_actors:
        envs, eval_envs = _env_pool(cfg, envs, eval_envs)
    with quiet_transformers():
        tokenizer = load_tokenizer(cfg.model.path)
    try:
        engine = make_engine(engine_kind, tokenizer=tokenizer, model_path=cfg.model.path, seed=cfg.train.seed, **engine_options)
    except ImportError as e:
        raise ConfigError(str(e)) from None
    collector, eval_collector = _collectors(cfg, engine, tokenizer, envs, eval_envs)
    return Components(cfg, None, tokenizer, engine, collector, eval_collector=eval_collector,
                      tasks=TaskSplit(cfg, envs, eval_envs))


def describe(c: Components) -> dict[str, str]:
    """What the run is made of, as the loop announces it before step 1."""
    cfg = c.cfg
    model = cfg.model.path
    if c.model is not None:
        size = sum(p.numel() for p in c.model.parameters()) / 1e6
        model += f" ({type(c.model).__name__}, {size:.1f}M parameters, {cfg.model.dtype})"
        if is_lora(c.model):
            model += f", LoRA: {trainable_parameters(c.model) / 1e6:.2f}M trained"
        if is_checkpointed(c.model):
            model += ", activation checkpointing"
    held = f"{len(c.tasks.eval_tasks)} distinct tasks"
    if len(c.tasks.eval_tasks) < cfg.eval.num_tasks:
        held += f", fewer than the {cfg.eval.num_tasks} asked: the env has few distinct tasks"
    return {
        "model": model,
        "env": cfg.env.id + (f" (evaluated on {cfg.eval.env_id})" if cfg.eval.env_id else ""),
        "held-out": f"{held} (eval seeds from {cfg.eval.seed_start}; training skips their task keys)",
        "estimator": cfg.algo.estimator,
        "engine": type(c.engine).__name__,
        "precision": precision_note(cfg.model.autocast_bf16),
        "threads": str(torch.get_num_threads()),
    }


def _split_model_path(path: str) -> tuple[str, Path | None]:
    """``(base model path, adapter directory or None)`` of ``model.path`` (:func:`~turnrl.models.lora.split_adapter_path`)."""
    try:
        return split_adapter_path(path)
    except LoraError as e:
        raise ConfigError(f"model.path={path!r}: {e}") from None


def with_lora(cfg: Config, model, adapter: Path | None = None):
    """``model`` with LoRA adapters: the ``adapter`` directory's (trainable), else fresh ones as ``lora`` sets them
    (their directory naming ``model.path`` as the base)."""
    try:
        if adapter is not None:
            return load_lora(model, adapter)
        a = cfg.lora
        return add_lora(model, rank=a.rank, alpha=a.alpha, target_modules=a.target_modules, dropout=a.dropout,
                        use_rslora=a.use_rslora, base=cfg.model.path)
    except LoraError as e:
        raise ConfigError(str(e)) from None


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Loading or saving a model without transformers' chatter the user cannot act on (deprecation notices,
    progress bars).

    Narrow on purpose: transformers' own logger is raised to ERROR and its bars are off only inside the block, and
    only its FutureWarning / DeprecationWarning are ignored; everything else still shows.
    """
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            for category in (FutureWarning, DeprecationWarning):
                warnings.filterwarnings("ignore", category=category, module=r"transformers(\.|$)")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


# ---------------------------------------------------------------------------------------------- envs and tasks


def env_factories(cfg: Config, experience: ExperienceLibrary | None = None, skills: SkillLibrary | None = None,
                  curriculum: Curriculum | None = None) -> tuple[Callable[[], Env], Callable[[], Env] | None]:
    """Factories of the training envs and, when ``eval.env_id`` is set, of the evaluation envs (else None), each env
    wrapped by the agent libraries given (:func:`with_libraries`) and the memory actions.

    Each is tried once here (built and reset), so a bad id or keyword stops with a :class:`ConfigError`.
    """
    kwargs = dict(cfg.env.kwargs, max_turns=cfg.env.max_turns, invalid_penalty=cfg.env.invalid_penalty,
                  progress_reward=cfg.env.progress_reward, reward=cfg.env.reward)
    if curriculum is not None:
        return _leveled_envs(cfg, kwargs, curriculum, experience, skills)
    envs = _tried(cfg.env.id, kwargs, cfg.train.seed_start, f"env.id={cfg.env.id!r} with env.kwargs={cfg.env.kwargs}")
    envs = with_libraries(cfg, envs, experience, skills)
    if not cfg.eval.env_id:
        return with_memory(cfg, envs), None
    eval_kwargs = {**kwargs, **cfg.eval.env_kwargs}
    eval_envs = _tried(cfg.eval.env_id, eval_kwargs, cfg.eval.seed_start, f"eval.env_id={cfg.eval.env_id!r}")
    return with_memory(cfg, envs), with_memory(cfg, with_libraries(cfg, eval_envs, experience, skills))


def _leveled_envs(cfg: Config, kwargs: dict[str, Any], curriculum: Curriculum, experience: ExperienceLibrary | None,
                  skills: SkillLibrary | None) -> tuple[LeveledEnvs, Callable[[], Env]]:
    """Under a curriculum: the training envs at its current level (each level's keywords over ``kwargs``) and the
    evaluation envs, which stay on ``eval.env_id`` / ``eval.env_kwargs`` or else on ``env.id`` / ``env.kwargs``."""
    wrap = functools.partial(_wrapped, cfg, experience=experience, skills=skills)
    levels = [wrap(_tried(cfg.env.id, {**kwargs, **level}, cfg.train.seed_start, f"curriculum.levels[{i}]={level} on "
                          f"env.id={cfg.env.id!r}")) for i, level in enumerate(curriculum.levels)]
    eval_kwargs = {**kwargs, **cfg.eval.env_kwargs} if cfg.eval.env_id else kwargs
    eval_envs = _tried(cfg.eval.env_id or cfg.env.id, eval_kwargs, cfg.eval.seed_start, f"eval.env_id={cfg.eval.env_id!r}")
    return LeveledEnvs(levels, curriculum), wrap(eval_envs)


def _wrapped(cfg: Config, factory: Callable[[], Env], experience: ExperienceLibrary | None, skills: SkillLibrary | None
             ) -> Callable[[], Env]:
    return with_memory(cfg, with_libraries(cfg, factory, experience, skills))


def with_memory(cfg: Config, factory: Callable[[], Env]) -> Callable[[], Env]:
    """``factory``, each env wrapped by :class:`MemoryActions` when ``memory.actions`` enables any (docs/memory.md)."""
    m = cfg.memory
    if not m.actions:
        return factory
    if "compress" in m.actions and cfg.rollout.context != "budgeted":
        raise ConfigError(f"memory.actions has 'compress', which replaces earlier turns of a budgeted context; "
                          f"rollout.context={cfg.rollout.context!r} keeps them: set rollout.context=budgeted "
                          "(with rollout.budget_tokens) or drop compress from memory.actions")
    budgeted = cfg.rollout.context == "budgeted"
    return lambda: MemoryActions(factory(), tuple(m.actions), m.max_actions, budgeted, m.few_shot)


def _tried(env_id: str, kwargs: dict[str, Any], seed: int, what: str) -> Callable[[], Env]:
    try:
        probe = make(env_id, **kwargs)
        probe.reset(seed=seed)
        probe.close()
    except (KeyError, TypeError, ValueError, ConnectionError, ImportError) as e:  # a server down, a missing extra
        raise ConfigError(f"{what}: {e}") from None
    return lambda: make(env_id, **kwargs)


class Task(NamedTuple):
    """A seed and its task key (None when the env's reset failed: the seed then counts as a task of its own)."""

    seed: int
    key: str | None


KEY_CHARS = 256  # a longer task key is kept as its SHA-256 digest
SCAN_LIMIT = 4096  # consecutive held-out seeds after which training gives up looking for a task of its own


def task_key(env: Env, observation: str) -> str:
    """``env.task_key()`` after a reset; the initial ``observation`` for an env without one (the only fallback).

    Keys longer than :data:`KEY_CHARS` characters become ``"sha256:<hex>"``.
    """
    key_of = getattr(env, "task_key", None)  # an env may satisfy the protocol without one
    try:
        key = str(key_of()) if key_of is not None else observation
    except NotImplementedError:
        key = observation
    return key if len(key) <= KEY_CHARS else "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def task_keys(env_factory: Callable[[], Env], seeds: Iterable[int]) -> list[Task]:
    """The task of each seed: a fresh env per seed, reset concurrently (as the collector resets them)."""

    async def one(seed: int) -> Task:
        env = env_factory()
        try:
            observation, _ = await env.areset(seed=seed)
            return Task(seed, task_key(env, observation))
        except Exception:  # noqa: BLE001 - the collector records the failing reset as an env error
            return Task(seed, None)
        finally:
            with contextlib.suppress(Exception):
                env.close()

    async def every() -> list[Task]:
        return list(await asyncio.gather(*(one(s) for s in seeds)))

    return asyncio.run(every())


class TaskSplit:
    """Evaluation and training tasks, disjoint by task key: held out means unseen, not merely another seed.

    - Evaluation: the first ``eval.num_tasks`` seeds from ``eval.seed_start`` whose keys are distinct (a seed whose
      task an earlier seed already has is skipped). At most ``16 * eval.num_tasks`` seeds are looked at, so an env
      with fewer distinct tasks gets a smaller set; ``eval/distinct_tasks`` reports its size.
    - Training: the seeds from ``train.seed_start`` upwards whose key is no evaluation key, in order. Step ``t``,
      sampling round ``r`` takes positions ``[(t R + r) n, (t R + r + 1) n)`` of that sequence (``n`` =
      ``rollout.tasks_per_step``, ``R`` = ``algo.dynamic_sampling_rounds``): a pure function of the step, so a
      resumed run draws the same tasks; with nothing held out it is the block of ``n`` seeds from
      ``train.seed_start + (t R + r) n``.

    A key costs a reset of a fresh env; each seed's is computed once (a resumed run recomputes those before it).
    """

    def __init__(self, cfg: Config, train_envs: Callable[[], Env], eval_envs: Callable[[], Env] | None = None) -> None:
        self.cfg = cfg
        self.train_envs, self.eval_envs = train_envs, eval_envs or train_envs
        self._train: list[Task] = []  # the training sequence found so far
        self._next_seed = cfg.train.seed_start
        self._held_since = 0  # consecutive seeds skipped since the last training task found

    @functools.cached_property
    def eval_tasks(self) -> list[Task]:
        want, first = self.cfg.eval.num_tasks, self.cfg.eval.seed_start
        chosen: list[Task] = []
        keys: set[str | None] = set()
        seed, last = first, first + 16 * want
        while len(chosen) < want and seed < last:
            batch = task_keys(self.eval_envs, range(seed, min(seed + want - len(chosen), last)))
            seed = batch[-1].seed + 1
            for t in batch:
                if t.key is None or t.key not in keys:
                    chosen.append(t)
                    keys.add(t.key)
        return chosen

    @functools.cached_property
    def held_keys(self) -> frozenset[str]:
        return frozenset(t.key for t in self.eval_tasks if t.key is not None)

    def train_tasks(self, step: int, round_: int = 0) -> list[Task]:
        """The tasks of training step ``step`` (0-based), dynamic-sampling round ``round_``."""
        n = self.cfg.rollout.tasks_per_step
        first = (step * self.cfg.algo.dynamic_sampling_rounds + round_) * n
        while len(self._train) < first + n:
            size = min(256, first + n - len(self._train) + self._held_since)  # look further while seeds keep being held out
            batch = task_keys(self.train_envs, range(self._next_seed, self._next_seed + size))
            self._next_seed += len(batch)
            fresh = [t for t in batch if t.key is None or t.key not in self.held_keys]
            self._train += fresh
            self._held_since = 0 if fresh else self._held_since + len(batch)
            if self._held_since >= SCAN_LIMIT:
                raise ConfigError(
                    f"no training task is left outside the held-out set: the {self._held_since} seeds before "
                    f"{self._next_seed} all draw one of the {len(self.held_keys)} evaluation tasks. {self.cfg.env.id} has too "
                    "few distinct tasks for a held-out split: give it more (env.kwargs) or evaluate on another env (eval.env_id)")
        return self._train[first : first + n]

    def training_only(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        """The ``trajectories`` (demonstrations) whose task is no held-out one: each task key is recomputed from the
        seed by a fresh training env (a file's own ``task_key`` is not trusted); a seed without a key is dropped."""
        keys = {t.seed: t.key for t in task_keys(self.train_envs, sorted({tr.seed for tr in trajectories}))}
        return [tr for tr in trajectories if keys[tr.seed] is not None and keys[tr.seed] not in self.held_keys]


def demo_samples(demos: list[Trajectory]) -> list[TrainSample]:
    """Training samples of demonstrations, laid out as the learner lays out rollouts (loss mask on the agent's tokens)."""
    return build_samples(demos, Advantages.zeros(demos))


# ---------------------------------------------------------------------------------------------- engine, collectors


def _engine(cfg: Config, model, tokenizer) -> Engine:
    """The engine ``rollout.engine`` names, sampling from ``model`` (the learner's module)."""
    if cfg.rollout.engine == "vllm" and is_lora(model):
        raise ConfigError("rollout.engine=vllm does not sample from LoRA adapters (vLLM's LoRA path is not wired in): "
                          "use rollout.engine=native or hf, or lora.enabled=false")
    try:
        return make_engine(
            cfg.rollout.engine, model, tokenizer, bf16=use_bf16(cfg.model.autocast_bf16), seed=cfg.train.seed,
            max_slots=max(cfg.rollout.tasks_per_step * cfg.rollout.group_size, cfg.eval.num_tasks),
            max_len=cfg.rollout.max_context_tokens, model_path=cfg.model.path, threads=cfg.train.threads or None,
        )
    except (UnsupportedModelError, ImportError) as e:  # ImportError: vllm is an optional extra
        raise ConfigError(f"rollout.engine={cfg.rollout.engine}: {e}") from None


def _collectors(cfg: Config, engine: Engine, tokenizer, envs, eval_envs, selfplay: SelfPlay | None = None
                ) -> tuple[Collector, Collector | None]:
    """The training and evaluation collectors (None: evaluate with the training one); a multi-agent env gets the
    multi-agent collector, under self-play with the pool as the training lineup and the base model as every
    evaluation opponent."""
    r = cfg.rollout
    try:
        ctx = ContextSpec(r.context, r.history_turns, r.few_shot, r.max_context_tokens, r.max_observation_tokens, r.budget_tokens)
    except ValueError as e:
        raise ConfigError(f"rollout: {e}") from None

    def collector(factory, lineup: Lineup | None = None) -> Collector:
        if _is_multiagent(factory):
            _check_multiagent(cfg)
            return MultiAgentCollector(engine, tokenizer, factory, ctx, step_timeout_s=cfg.env.step_timeout_s, lineup=lineup)
        return Collector(engine, tokenizer, factory, ctx, step_timeout_s=cfg.env.step_timeout_s)

    if selfplay is not None:
        return collector(envs, selfplay), collector(eval_envs or envs, selfplay.against_base())
    return collector(envs), collector(eval_envs) if eval_envs is not None else None


def _is_multiagent(env_factory: Callable[[], Any]) -> bool:
    env = env_factory()
    env.close()
    return isinstance(env, MultiAgentEnv)


def _check_multiagent(cfg: Config) -> None:
    """ConfigError for what multi-agent collection does not support."""
    if estimator_flag(get_estimator(cfg.algo.estimator), "needs_greedy_baseline"):
        raise ConfigError(f"algo.estimator={cfg.algo.estimator} takes one greedy baseline per task, but a multi-agent task "
                          "has one group per role: use grpo, rloo, team_grpo or counterfactual")
    if cfg.scale.workers:
        raise ConfigError(f"{cfg.env.id} is multi-agent, collected in the training process only: set scale.workers=0")


def _selfplay(cfg: Config, model, tokenizer, envs: Callable[[], Any]) -> SelfPlay | None:
    """The self-play pool when ``multiagent.selfplay`` is on; ConfigError when the env is not multi-agent."""
    m = cfg.multiagent
    if not m.selfplay:
        return None
    if not _is_multiagent(envs):
        raise ConfigError(f"multiagent.selfplay=true needs a multi-agent env (e.g. nim-v0); {cfg.env.id} is single-agent")
    if cfg.scale.async_mode:  # the next step's games would be drawn before this step's are rated and snapshotted
        raise ConfigError("multiagent.selfplay=true collects each step after the previous update: set scale.async_mode=false")
    return SelfPlay(model, lambda frozen: _engine(cfg, frozen, tokenizer), size=m.pool_size, snapshot_every=m.snapshot_every,
                    elo_k=m.elo_k, league=league(m.league, envs, tokenizer, cfg.env.id))


def rollout_parts(cfg: Config, model, tokenizer) -> tuple[Collector, Collector | None]:
    """What a rollout worker holds (:mod:`turnrl.scale.workers`): an engine over ``model`` and the training and
    evaluation collectors, built exactly as :func:`build` builds them."""
    envs, eval_envs = env_factories(cfg)
    return _collectors(cfg, _engine(cfg, model, tokenizer), tokenizer, envs, eval_envs)


def _ray_collectors(cfg: Config, model, tokenizer, engine: Engine, has_eval: bool):
    if any(agent_libraries(cfg)) or cfg.multiagent.selfplay:  # what the driver learns would not reach the workers
        raise ConfigError(f"scale.workers={cfg.scale.workers} does not carry the experience/skill libraries or the "
                          "self-play pool to the workers yet: set scale.workers=0, or turn them off")
    try:
        from turnrl.scale.workers import ray_collectors
    except ImportError as e:  # ray is an optional extra
        raise ConfigError(f"scale.workers={cfg.scale.workers}: {e}") from None
    return ray_collectors(cfg, model, tokenizer, engine, rollout_parts, has_eval)


def _env_pool(cfg: Config, envs, eval_envs) -> tuple[Callable[[], Env], Callable[[], Env] | None]:
    try:
        from turnrl.scale.envpool import pooled_factories
    except ImportError as e:  # ray is an optional extra
        raise ConfigError(f"scale.env_actors={cfg.scale.env_actors}: {e}") from None
    return pooled_factories(cfg, envs, eval_envs)


def rollout_server(cfg: Config, engine: Engine, tokenizer, gate: EngineGate) -> RolloutServer:
    """The OpenAI-compatible rollout service over ``engine`` on ``serve.host:serve.port`` (not started; docs/serve.md).
    While training (``serve.train``) it refuses any temperature but ``rollout.temperature``, which the learner uses."""
    s = cfg.serve
    store = SessionStore(tokenizer, Path(s.record_file) if s.record_file else None, cfg.env.id, s.session_timeout_s)
    try:
        return RolloutServer(engine, tokenizer, store, model_name=cfg.model.path, defaults=sampling_params(cfg),
                             max_context_tokens=cfg.rollout.max_context_tokens, request_timeout_s=s.request_timeout_s,
                             gate=gate, fixed_temperature=cfg.rollout.temperature if s.train else None, host=s.host,
                             port=s.port)
    except OSError as e:  # the port is taken, the address is not this machine's
        raise ConfigError(f"serve.host={s.host} serve.port={s.port}: {e}; pick another (serve.port=0: any free port)") from None


def build_server(cfg: Config) -> RolloutServer:
    """``turnrl serve``: ``model.path`` (a LoRA checkpoint with its adapters) behind the rollout service, open."""
    base, adapter = _split_model_path(cfg.model.path)
    with quiet_transformers():
        tokenizer = load_tokenizer(base)
        model = load_model(base, dtype=getattr(torch, cfg.model.dtype))
        if adapter is not None:
            model = with_lora(cfg, model, adapter)
    return rollout_server(cfg, _engine(cfg, model, tokenizer), tokenizer, EngineGate(is_open=True))


def _served_collector(cfg: Config, engine: Engine, tokenizer, tasks: TaskSplit) -> ServedCollector:
    """``serve.train``: the rollout service, started closed (the loop opens it while it waits for episodes)."""
    if cfg.scale.workers:
        raise ConfigError("serve.train=true takes episodes from the rollout service, not from Ray workers: set "
                          "scale.workers=0")
    if estimator_flag(get_estimator(cfg.algo.estimator), "needs_greedy_baseline"):
        raise ConfigError(f"algo.estimator={cfg.algo.estimator} rolls out a greedy baseline per task, which served "
                          "episodes do not have: use grpo_turn, grpo or rloo with serve.train=true")
    server = rollout_server(cfg, engine, tokenizer, EngineGate(is_open=False)).start()
    print(f"serve.train: training on episodes played through {server.url} (docs/serve.md)", file=sys.stderr)
    return ServedCollector(server, lambda key: key in tasks.held_keys, cfg.serve.wait_timeout_s)


def _learner(cfg: Config, model, pad_id: int, ref, critic: Critic | None) -> Learner:
    """The learner; with ``scale.learner_ranks > 1`` the data-parallel one (:mod:`turnrl.scale.distributed`), sharded
    with ``scale.learner_sharding=fsdp`` (:mod:`turnrl.scale.sharded`)."""
    from turnrl.scale.distributed import launched

    params = LearnerParams.from_config(cfg)
    if (where := launched()) is not None and where[1] != cfg.scale.learner_ranks:  # the other ranks wait to serve
        raise ConfigError(f"the launcher started {where[1]} ranks (WORLD_SIZE={where[1]}) but scale.learner_ranks="
                          f"{cfg.scale.learner_ranks}: set scale.learner_ranks={where[1]}, or launch "
                          f"{cfg.scale.learner_ranks} rank(s)")
    if cfg.scale.learner_ranks == 1:
        return Learner(model, params, pad_id, ref_model=ref, critic=critic)
    from turnrl.scale.distributed import DataParallelLearner
    from turnrl.scale.sharded import ShardedLearner

    kind = ShardedLearner if cfg.scale.learner_sharding == "fsdp" else DataParallelLearner
    return kind.spawn(cfg.scale.learner_ranks, cfg.scale.sync_timeout_s, model, params, pad_id, ref, critic)


def sampling_params(cfg: Config, greedy: bool = False) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        max_new_tokens=r.max_new_tokens, temperature=0.0 if greedy else r.temperature, top_p=r.top_p, top_k=r.top_k
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ---------------------------------------------------------------------------------------------- checkpoints


def save(c: Components, run_dir: Path, step: int, monitor_state: dict[str, Any]) -> Path:
    """Checkpoint the weights, optimizer, engine, reward-shaper, agent-library and monitor state (and the RNGs) at
    ``step``, with its model card (``README.md``, :mod:`turnrl.monitor.card`)."""
    state = {"learner": c.learner.state_dict(), "engine": c.engine.state_dict(), "monitor": monitor_state}
    if c.shaper is not None:
        state["reward_shaper"] = c.shaper.state_dict()
    state["libraries"] = {type(library).__name__: library.state_dict() for library in c.libraries}
    if c.curriculum is not None:
        state["curriculum"] = c.curriculum.state_dict()
    with quiet_transformers():
        ckpt = checkpoint.save_checkpoint(run_dir, step, c.model, c.tokenizer, state, keep=c.cfg.log.keep_checkpoints)
    write_model_card(ckpt, c.cfg)
    return ckpt


def restore(c: Components, ckpt: Path, rng: bool = False) -> dict[str, Any]:
    """Load a checkpoint's weights, optimizer, engine, reward-shaper and agent-library state (and the RNGs when resuming).
    Returns the checkpoint's state (``step``, ``monitor``, ...). Raises :class:`~turnrl.checkpoint.CheckpointError`
    when it is damaged, unsafe, or not of this model.
    """
    state = checkpoint.load_state(ckpt)  # read and checked before anything is loaded
    checkpoint.load_weights(ckpt, c.model)
    try:
        c.learner.load_state_dict(state["learner"])
        c.engine.load_state_dict(state["engine"])
        if c.shaper is not None and "reward_shaper" in state:
            c.shaper.load_state_dict(state["reward_shaper"])
        load_libraries(c, state)
        if c.curriculum is not None:
            c.curriculum.load_state_dict(state["curriculum"])
        if rng:
            checkpoint.set_rng_state(state["rng"])
    except (KeyError, ValueError, TypeError, RuntimeError) as e:
        raise checkpoint.CheckpointError(f"{ckpt / checkpoint.STATE}: does not fit this run ({type(e).__name__}: {e})") from None
    return state


def load_libraries(c: Components, state: dict[str, Any]) -> None:
    """Load the agent libraries' state from a checkpoint's ``state`` (what ``checkpoint.load_state`` read)."""
    for library in c.libraries:
        library.load_state_dict(state["libraries"][type(library).__name__])
