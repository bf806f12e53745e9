"""Config -> components: the envs, the model, the engine, the collectors, the learner.

``turnrl train``, ``turnrl eval`` and the Python API build a run here and nowhere else. Every env id and
keyword is tried once before anything big loads, so a typo fails in a second with the env's own message.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from turnrl.agent.context import ContextSpec
from turnrl.config import Config, ConfigError
from turnrl.credit.rewards import RewardShaper
from turnrl.engines import Engine, SamplingParams, make_engine
from turnrl.engines.native import UnsupportedModelError
from turnrl.envs import Env, make
from turnrl.learner import Critic, CriticParams, Learner, LearnerParams
from turnrl.models import frozen_copy, load_model, load_tokenizer
from turnrl.rollout import Collector


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


def build(cfg: Config, model=None, tokenizer=None) -> Components:
    """Model, engine, collectors and learner for training. ``model``/``tokenizer`` override ``cfg.model.path`` (tests)."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    seed_everything(cfg.train.seed)
    envs, eval_envs = env_factories(cfg)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg.model.path)
    if model is None:
        model = load_model(cfg.model.path, dtype=getattr(torch, cfg.model.dtype))
    ref = frozen_copy(model) if cfg.model.reference else None
    engine = _engine(cfg, model, tokenizer)
    collector, eval_collector = _collectors(cfg, engine, tokenizer, envs, eval_envs)
    critic = Critic(model, CriticParams.from_config(cfg), tokenizer.pad_token_id) if cfg.algo.critic != "none" else None
    learner = Learner(model, LearnerParams.from_config(cfg), tokenizer.pad_token_id, ref_model=ref, critic=critic)
    a = cfg.algo
    shaper = None
    if a.kl_in_reward > 0 or a.reward_norm == "running":
        shaper = RewardShaper(a.kl_in_reward, a.kl_target, a.kl_horizon, normalise=a.reward_norm == "running")
    return Components(cfg, model, tokenizer, engine, collector, learner, shaper, eval_collector)


def build_for_eval(cfg: Config, engine_kind: str, **engine_options: Any) -> Components:
    """Envs, tokenizer and collectors around a vLLM or OpenAI-compatible engine: what evaluation needs, no learner.

    The tokenizer comes from ``model.path`` and must be the served model's (``docs/engines.md``).
    """
    envs, eval_envs = env_factories(cfg)  # fail before contacting a server or loading vLLM
    tokenizer = load_tokenizer(cfg.model.path)
    try:
        engine = make_engine(engine_kind, tokenizer=tokenizer, model_path=cfg.model.path, seed=cfg.train.seed, **engine_options)
    except ImportError as e:
        raise ConfigError(str(e)) from None
    collector, eval_collector = _collectors(cfg, engine, tokenizer, envs, eval_envs)
    return Components(cfg, None, tokenizer, engine, collector, eval_collector=eval_collector)


def env_factories(cfg: Config) -> tuple[Callable[[], Env], Callable[[], Env] | None]:
    """Factories of the training envs and, when ``eval.env_id`` is set, of the evaluation envs (else None).

    Each is tried once here (built and reset), so a bad id or keyword stops with a :class:`ConfigError`.
    """
    kwargs = dict(cfg.env.kwargs, max_turns=cfg.env.max_turns, invalid_penalty=cfg.env.invalid_penalty,
                  progress_reward=cfg.env.progress_reward)
    envs = _tried(cfg.env.id, kwargs, cfg.train.seed_start, f"env.id={cfg.env.id!r} with env.kwargs={cfg.env.kwargs}")
    if not cfg.eval.env_id:
        return envs, None
    eval_kwargs = {**kwargs, **cfg.eval.env_kwargs}
    return envs, _tried(cfg.eval.env_id, eval_kwargs, cfg.eval.seed_start, f"eval.env_id={cfg.eval.env_id!r}")


def _tried(env_id: str, kwargs: dict[str, Any], seed: int, what: str) -> Callable[[], Env]:
    try:
        probe = make(env_id, **kwargs)
        probe.reset(seed=seed)
        probe.close()
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{what}: {e}") from None
    return lambda: make(env_id, **kwargs)


def _engine(cfg: Config, model, tokenizer) -> Engine:
    """The engine ``rollout.engine`` names, sampling from ``model`` (the learner's module)."""
    try:
        return make_engine(
            cfg.rollout.engine, model, tokenizer, bf16=cfg.model.autocast_bf16, seed=cfg.train.seed,
            max_slots=max(cfg.rollout.tasks_per_step * cfg.rollout.group_size, cfg.eval.num_tasks),
            max_len=cfg.rollout.max_context_tokens, model_path=cfg.model.path,
        )
    except (UnsupportedModelError, ImportError) as e:  # ImportError: vllm is an optional extra
        raise ConfigError(f"rollout.engine={cfg.rollout.engine}: {e}") from None


def _collectors(cfg: Config, engine: Engine, tokenizer, envs, eval_envs) -> tuple[Collector, Collector | None]:
    r = cfg.rollout
    ctx = ContextSpec(r.context, r.history_turns, r.few_shot, r.max_context_tokens)
    collector = Collector(engine, tokenizer, envs, ctx)
    return collector, Collector(engine, tokenizer, eval_envs, ctx) if eval_envs is not None else None


def sampling_params(cfg: Config, greedy: bool = False) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        max_new_tokens=r.max_new_tokens, temperature=0.0 if greedy else r.temperature, top_p=r.top_p, top_k=r.top_k
    )


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
