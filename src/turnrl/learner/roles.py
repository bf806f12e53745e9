"""Per-role policies (``multiagent.policies=per_role``): every role of a multi-agent env trains weights of its own.

Each role gets its own copy of the starting weights (a whole model copy; under ``lora`` a copy carrying adapters of
its own), its own engine sampling from that copy, and its own :class:`~turnrl.learner.Learner` with its own AdamW
state. The loop holds them as one learner and one engine:

- :class:`RoleLearner` (``Components.learner``): :meth:`RoleLearner.update` gives each role's learner exactly the
  samples of that role's turns (``TrainSample.agent``, set by :func:`~turnrl.learner.build_samples`), so a role's step is the policy
  gradient of its own turns and advantages alone; a role with nothing to train on takes no step.
- :class:`~turnrl.rollout.multiagent.RoleEngines` (``Components.engine``): the multi-agent collector plays each
  role with its engine, and the loop's one ``sync_weights`` syncs every engine to its own role's weights.
- :class:`RoleModels` (``Components.model``): the roles' modules, which a checkpoint saves one directory per role
  (:func:`turnrl.checkpoint.model_dirs`).

The KL reference (``model.reference``) is the starting weights, shared: one frozen copy for every role (under LoRA
each role's own model with its adapters disabled, which is the same base). Starting weights: ``model.path``; when
that is a per-role checkpoint's ``model/`` (as ``turnrl eval --checkpoint`` sets it), each role starts from its own
weights in that checkpoint.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from turnrl import checkpoint
from turnrl.config import Config, ConfigError
from turnrl.engines.base import Engine
from turnrl.envs.multiagent import MultiAgentEnv
from turnrl.learner.learner import Learner, LearnerParams
from turnrl.models.freeze import freeze_lower_layers
from turnrl.models.lora import is_lora
from turnrl.models.recompute import checkpoint_layers, wanted as recompute_wanted
from turnrl.rollout.multiagent import RoleEngines
from turnrl.types import TrainSample, Trajectory

_SUMMED = ("train/loss", "train/num_samples", "train/num_tokens", "train/micro_batches")


class RoleModels(torch.nn.ModuleDict):
    """Each role's policy module by role name, in the env's role order."""


class RoleLearner:
    """The learners of per-role policies as the loop's one learner (module docstring); ``learners[role]`` trains
    ``role``. There is no critic."""

    critic = None

    def __init__(self, learners: Mapping[str, Learner]) -> None:
        self.learners = dict(learners)

    def update(self, samples: Sequence[TrainSample], value_batch=None,
               demos: Sequence[TrainSample] = ()) -> dict[str, float]:
        """One step of every role's learner on that role's samples; returns :func:`merged_metrics` of their metrics.

        ``value_batch`` and ``demos`` are :meth:`Learner.update`'s; per-role policies take neither (the config refuses
        a critic and demonstrations).
        """
        if value_batch is not None or demos:
            raise ValueError("per-role policies train no critic and no demonstrations")
        strays = {s.agent for s in samples} - set(self.learners)
        if strays:
            raise ValueError(f"samples of roles {sorted(strays, key=str)} have no policy; the policies are "
                             f"{list(self.learners)} (build them with build_samples)")
        return merged_metrics({role: learner.update([s for s in samples if s.agent == role])
                               for role, learner in self.learners.items()})

    def reference_turn_kl(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        """:meth:`Learner.reference_turn_kl` of each trajectory, computed by its role's learner."""
        out: list[list[float]] = [[] for _ in trajectories]
        for role, learner in self.learners.items():
            mine = [i for i, t in enumerate(trajectories) if t.agent == role]
            for i, kl in zip(mine, learner.reference_turn_kl([trajectories[i] for i in mine]) if mine else []):
                out[i] = kl
        return out

    def state_dict(self) -> dict[str, dict]:
        return {role: learner.state_dict() for role, learner in self.learners.items()}

    def load_state_dict(self, state: Mapping[str, dict]) -> None:
        for role, learner in self.learners.items():
            learner.load_state_dict(state[role])


@dataclass
class RolePolicies:
    """What :func:`role_policies` builds: the run's model, engine and learner under per-role policies."""

    models: RoleModels
    engines: RoleEngines
    learner: RoleLearner


def merged_metrics(per_role: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The run's ``train/*`` metrics from each role's update: ``train/loss`` and the counts summed, ``train/grad_norm``,
    ``train/lr`` and ``*_max`` the largest, ``*_min`` the smallest, every other (a per-token mean) weighted by the
    roles' token counts; and each role's own, ``train/<name>/<role>``."""
    tokens = {role: m.get("train/num_tokens", 0.0) for role, m in per_role.items()}
    total = sum(tokens.values())
    out: dict[str, float] = {}
    for key in sorted({k for m in per_role.values() for k in m}):
        values = {role: m[key] for role, m in per_role.items() if key in m}
        if key in _SUMMED:
            out[key] = sum(values.values())
        elif key.endswith("_min"):
            out[key] = min(values.values())
        elif key in ("train/grad_norm", "train/lr") or key.endswith("_max"):
            out[key] = max(values.values())
        elif total > 0:
            out[key] = sum(v * tokens[role] for role, v in values.items()) / total
    out.update({f"{k}/{role}": v for role, m in per_role.items() for k, v in m.items()})
    return out


def role_policies(cfg: Config, envs: Callable[[], Any], eval_envs: Callable[[], Any] | None, model, ref,
                  engine_for: Callable[[Any], Engine], pad_id: int) -> RolePolicies | None:
    """Per-role policies for ``multiagent.policies=per_role`` (None: shared). ``model`` is the starting policy (it
    becomes the first role's), ``ref`` the frozen reference or None, ``engine_for(module)`` an engine sampling from it.

    Raises :class:`ConfigError` for what per-role policies do not combine with (:func:`check_per_role`).
    """
    if cfg.multiagent.policies == "shared":
        return None
    roles = _roles(cfg, envs, eval_envs)
    check_per_role(cfg)
    try:
        models = RoleModels({role: model if i == 0 else copy.deepcopy(model) for i, role in enumerate(roles)})
    except KeyError as e:  # torch refuses a module name with a '.', or one of ModuleDict's own attributes
        raise ConfigError(f"{cfg.env.id}'s roles {list(roles)} cannot name per-role policies ({e}): set "
                          "multiagent.policies=shared") from None
    _start_from_checkpoint(cfg, models)
    params = LearnerParams.from_config(cfg)
    learners = {}
    for role, module in models.items():
        freeze_lower_layers(module, cfg.train.freeze_layers)  # before its optimizer is built
        if recompute_wanted(cfg.train.activation_checkpointing, module):
            checkpoint_layers(module)
        reference = (module if is_lora(module) else ref) if ref is not None else None
        learners[role] = Learner(module, params, pad_id, ref_model=reference)
    return RolePolicies(models, RoleEngines({role: engine_for(m) for role, m in models.items()}), RoleLearner(learners))


def check_per_role(cfg: Config) -> None:
    """ConfigError, naming the fix, for each setting per-role policies do not combine with."""
    refusals = {
        "multiagent.selfplay=false (self-play trains one policy against frozen copies of itself)":
            cfg.multiagent.selfplay,
        "scale.workers=0 (the roles' engines live in the training process)": cfg.scale.workers > 0,
        "scale.async_mode=false": cfg.scale.async_mode,
        "scale.learner_ranks=1": cfg.scale.learner_ranks > 1,
        "algo.critic=none (no per-role critic is built)": cfg.algo.critic != "none",
        "algo.demo_coef=0 (demonstrations are not split by role)": cfg.algo.demo_coef > 0,
        "serve.train=false": cfg.serve.train,
        "rollout.engine=hf or native (one vLLM engine per role is not wired in)": cfg.rollout.engine == "vllm",
    }
    for fix, refused in refusals.items():
        if refused:
            raise ConfigError(f"multiagent.policies=per_role does not combine with this setting: set {fix}, or "
                              "multiagent.policies=shared")


def _roles(cfg: Config, envs: Callable[[], Any], eval_envs: Callable[[], Any] | None) -> tuple[str, ...]:
    """The env's roles; ConfigError for a single-agent env, or an evaluation env with other roles."""
    roles = [_env_roles(factory) for factory in (envs, eval_envs) if factory is not None]
    if roles[0] is None:
        raise ConfigError(f"multiagent.policies=per_role needs a multi-agent env (e.g. relay-v0); {cfg.env.id} is "
                          "single-agent: set multiagent.policies=shared")
    if roles[-1] != roles[0]:
        raise ConfigError(f"multiagent.policies=per_role evaluates each role with its own policy, but "
                          f"eval.env_id={cfg.eval.env_id} has roles {roles[-1]} and {cfg.env.id} has {roles[0]}: "
                          "evaluate on an env with the same roles")
    return roles[0]


def _env_roles(factory: Callable[[], Any]) -> tuple[str, ...] | None:
    env = factory()
    env.close()
    return tuple(env.roles) if isinstance(env, MultiAgentEnv) else None


def _start_from_checkpoint(cfg: Config, models: RoleModels) -> None:
    """When ``model.path`` is a per-role checkpoint's ``model/`` (the first role's weights), load every role's."""
    path = Path(cfg.model.path)
    if path.name != "model" or not (path.parent / "roles").is_dir() or not (path.parent / checkpoint.STATE).is_file():
        return
    try:
        checkpoint.load_weights(path.parent, models)
    except checkpoint.CheckpointError as e:
        raise ConfigError(f"model.path={cfg.model.path} is a per-role checkpoint that does not fit {cfg.env.id}'s "
                          f"roles {list(models)}: {e}") from None
