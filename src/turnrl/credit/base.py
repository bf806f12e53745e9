"""The estimator contract: one signature, one registry.

Every advantage estimator is a plain function

    estimator(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages

registered by name with ``@register_estimator("name")``. The training loop looks it up with
``get_estimator(cfg.algo.estimator)`` and never asks which one it holds.

Output: :class:`turnrl.types.Advantages`, one row per trajectory in flattened group order
``[t for g in groups for t in g.trajectories]``, one float per turn (and, for token-level estimators, one
per response token). The learner spreads a turn's advantage over that turn's response tokens.

Env errors: a trajectory that ended in ``Termination.ENV_ERROR`` is not trained on, so it must not move
anyone else's baseline either. ``register_estimator`` wraps every estimator so that it runs on the groups
with those trajectories removed (:func:`without_env_errors`; critic values are filtered alike) and the
removed trajectories get advantage 0. No estimator special-cases env errors; group statistics, batch
whitening and anchor-state groups see only the trajectories that are trained on.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
from dataclasses import dataclass
from typing import Callable, Literal, Protocol, Sequence

import numpy as np

from turnrl.types import Advantages, Termination, Trajectory, TrajectoryGroup


@dataclass(frozen=True)
class ValueInputs:
    """Critic predictions for one batch, filled by the trainer when ``algo.critic`` is not ``none``.

    ``token_values[i][t][k]`` is V of the state just before response token k of turn t of trajectory i
    (flattened group order), i.e. the critic read at the position that predicts that token; the turn-level
    value of turn t is ``token_values[i][t][0]`` (the position before the turn's first response token).
    ``bootstrap[i]`` is the value after the last response token of trajectory i: GAE uses it only when
    the episode was truncated (a terminated episode's next-state value is 0).
    """

    token_values: list[list[list[float]]]
    bootstrap: list[float]


@dataclass(frozen=True)
class CreditParams:
    """Inputs every estimator shares; an estimator ignores the fields it does not use (its docstring says which)."""

    norm_std: bool = True
    """Divide group-centred rewards by the group std (GRPO). False gives Dr.GRPO's unnormalised advantage."""
    eps: float = 1e-6
    """Added to the std before dividing, so near-constant groups do not explode."""
    gamma: float = 1.0
    """Turn discount for estimators that use per-turn returns (``grpo_turn``, ``gigpo``)."""
    step_weight: float = 1.0
    """GiGPO: weight w of the anchor-state step-level advantage added to the episode-level one."""
    similarity: float = 1.0
    """GiGPO: anchors whose difflib character similarity ratio is >= this share a step-level group (1.0 = exact match)."""
    lam: float = 1.0
    """GAE lambda (``ppo_token``, ``ppo_turn``, ``ppo_bilevel``)."""
    gamma_token: float = 1.0
    """Per-token discount of token-level GAE (``ppo_token``) and within a turn (``ppo_bilevel``)."""
    whiten: bool = True
    """GAE estimators: whiten advantages over the batch (mean 0, std 1 over response tokens)."""
    whiten_std: Literal["population", "unbiased"] = "population"
    """Std of every batch whitening (GAE estimators, ``reinforce_pp*``): ``population`` divides the summed squares
    by n (OpenRLHF's advantage normalisation), ``unbiased`` by n - 1 (TRL's and verl's ``masked_whiten``)."""
    gigpo_pooling: Literal["trajectory", "step"] = "trajectory"
    """GiGPO's episode-level mean and std: over trajectories (the paper) or over step rows, where a trajectory counts
    once per turn it took (verl-agent's ``episode_norm_reward``)."""
    values: ValueInputs | None = None
    """Critic predictions for this batch (trainer-filled); estimators with ``needs_critic`` require them."""
    baseline_rewards: tuple[float | None, ...] | None = None
    """Per group, the episode reward of one greedy rollout of its task (trainer-filled for ``needs_greedy_baseline``);
    None for a group whose greedy rollout ended in an env error (that group then has no baseline)."""


class Estimator(Protocol):
    """An estimator may carry registry attributes the trainer honours without knowing which one it holds:

    - ``needs_critic = True``: the trainer fills ``params.values`` (and ``algo.critic`` must not be ``none``);
    - ``needs_greedy_baseline = True``: the trainer collects one greedy episode per task and fills
      ``params.baseline_rewards``;
    - ``value_targets(groups, params) -> (returns, mask)``: per-token value-loss targets (see ``credit.gae``).

    Read them with :func:`estimator_flag`.
    """

    def __call__(self, groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages: ...


def estimator_flag(estimator: Estimator, name: str) -> bool:
    """Whether ``estimator`` declares the boolean registry attribute ``name`` (absent = False)."""
    return bool(getattr(estimator, name, False))


_REGISTRY: dict[str, Estimator] = {}


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Decorator registering ``fn`` under ``name``; returns ``fn`` wrapped by :func:`excluding_env_errors`, so every
    registered estimator leaves env-error trajectories out of its statistics. A duplicate name is an error."""

    def deco(fn: Estimator) -> Estimator:
        if name in _REGISTRY and getattr(_REGISTRY[name], "__wrapped__", None) is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered; registered: {available_estimators()}")
        _REGISTRY[name] = excluding_env_errors(fn)
        return _REGISTRY[name]

    return deco


def get_estimator(name: str) -> Estimator:
    """The estimator registered as ``name``; an unknown name raises ``ValueError`` naming the valid ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown advantage estimator {name!r}.{hint} Valid: {', '.join(available_estimators())}") from None


def available_estimators() -> list[str]:
    """Registered estimator names, sorted."""
    return sorted(_REGISTRY)


def episode_rewards(groups: Sequence[TrajectoryGroup]) -> list[list[float]]:
    """Per group, each trajectory's episode reward ``R_i = trajectory.total_reward`` (sum of its turn rewards).

    Raises ``ValueError`` on a non-finite reward: a NaN would silently poison every advantage in its group.
    """
    out = [[t.total_reward for t in g.trajectories] for g in groups]
    for gi, rs in enumerate(out):
        for ti, r in enumerate(rs):
            if not math.isfinite(r):
                raise ValueError(f"group {gi} trajectory {ti} has non-finite reward {r}")
    return out


def flat_group_index(groups: Sequence[TrajectoryGroup]) -> np.ndarray:
    """Group id of each trajectory in flattened order. Shape: (num_trajectories,)."""
    return np.repeat(np.arange(len(groups)), [len(g.trajectories) for g in groups]).astype(np.int64)


def broadcast_to_turns(groups: Sequence[TrajectoryGroup], per_traj: np.ndarray) -> Advantages:
    """Give every turn of trajectory i the value ``per_traj[i]`` (flattened order)."""
    trajs = [t for g in groups for t in g.trajectories]
    return Advantages([[float(a)] * t.num_turns for a, t in zip(per_traj.tolist(), trajs)])


# ----------------------------------------------------------------------------------------- env errors


def is_env_error(trajectory: Trajectory) -> bool:
    """Whether the episode ended because the env raised; such a trajectory is never trained on."""
    return trajectory.termination == Termination.ENV_ERROR


def without_env_errors(groups: Sequence[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """The same groups, in order, without their env-error trajectories (a group may be left empty)."""
    return [dataclasses.replace(g, trajectories=[t for t in g.trajectories if not is_env_error(t)]) for g in groups]


def excluding_env_errors(fn: Estimator) -> Estimator:
    """``fn`` run on :func:`without_env_errors` of its groups, with ``params.values`` filtered to the same
    trajectories; each env-error trajectory gets advantage 0 on every turn (and token). Batches without env
    errors go to ``fn`` unchanged."""

    @functools.wraps(fn)
    def run(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
        trajs = [t for g in groups for t in g.trajectories]
        keep = [not is_env_error(t) for t in trajs]
        if all(keep):
            return fn(groups, params)
        if params.values is not None:
            params = dataclasses.replace(params, values=_kept_values(params.values, keep))
        return _scatter(fn(without_env_errors(groups), params), keep, trajs)

    return run


def _kept_values(values: ValueInputs, keep: Sequence[bool]) -> ValueInputs:
    """The critic values of the kept trajectories (``keep`` is per trajectory, flattened order)."""
    if len(values.token_values) != len(keep) or len(values.bootstrap) != len(keep):
        raise ValueError(f"{len(keep)} trajectories but critic values for {len(values.token_values)} "
                         f"(bootstrap {len(values.bootstrap)})")
    return ValueInputs([v for v, k in zip(values.token_values, keep) if k], [b for b, k in zip(values.bootstrap, keep) if k])


def _scatter(advantages: Advantages, keep: Sequence[bool], trajs: Sequence[Trajectory]) -> Advantages:
    """Advantages of the kept trajectories back in their places; zeros for the others."""
    rows = iter(range(len(advantages)))
    index = [next(rows) if k else None for k in keep]
    turns = [advantages.turns[i] if i is not None else [0.0] * t.num_turns for i, t in zip(index, trajs)]
    if advantages.tokens is None:
        return Advantages(turns)
    tokens = [advantages.tokens[i] if i is not None else [[0.0] * len(turn.response_ids) for turn in t.turns]
              for i, t in zip(index, trajs)]
    return Advantages(turns, tokens)


@dataclass(frozen=True)
class GroupCounts:
    """Per batch, what group-relative credit could not use (logged by the training loop)."""

    singleton_groups: int
    """Groups left with exactly one trajectory once env errors are out: no baseline, advantage 0 (see docs)."""
    env_error_trajectories: int
    """Trajectories excluded from credit and training because their env raised."""


def group_counts(groups: Sequence[TrajectoryGroup]) -> GroupCounts:
    """Count singleton groups (after excluding env errors) and env-error trajectories in ``groups``."""
    clean = without_env_errors(groups)
    errors = sum(len(g.trajectories) for g in groups) - sum(len(g.trajectories) for g in clean)
    return GroupCounts(singleton_groups=sum(len(g.trajectories) == 1 for g in clean), env_error_trajectories=errors)


# ----------------------------------------------------------------------------------------- batch whitening


def batch_std(values: np.ndarray, params: CreditParams) -> float:
    r"""The std a batch whitening divides by, over every entry of ``values`` (a flat batch of advantages or returns).

    ``params.whiten_std = "population"``: sqrt(sum (x - mean)^2 / n), as OpenRLHF normalises advantages
    (``experience_maker``); ``"unbiased"``: sqrt(sum (x - mean)^2 / (n - 1)), as TRL's and verl's ``masked_whiten``
    (``masked_var(unbiased=True)``). Callers add ``eps`` to it; OpenRLHF clamps the variance at 1e-8 and TRL and verl
    add 1e-8 to the variance instead.
    """
    ddof = {"population": 0, "unbiased": 1}.get(params.whiten_std)
    if ddof is None:
        raise ValueError(f"whiten_std must be 'population' or 'unbiased' (got {params.whiten_std!r})")
    return float(values.std(ddof=ddof))
