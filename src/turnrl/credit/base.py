"""The estimator contract: one signature, one registry.

Every advantage estimator is a plain function

    estimator(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages

registered by name with ``@register_estimator("name")``. The training loop looks it up with
``get_estimator(cfg.algo.estimator)`` and never asks which one it holds.

Output: :class:`turnrl.types.Advantages`, one row per trajectory in flattened group order
``[t for g in groups for t in g.trajectories]``, one float per turn (and, for token-level estimators, one
per response token). The learner spreads a turn's advantage over that turn's response tokens.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from turnrl.types import Advantages, TrajectoryGroup


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
    """GiGPO: anchors whose token-Jaccard similarity is >= this share a step-level group (1.0 = exact match)."""
    lam: float = 1.0
    """GAE lambda (``ppo_token``, ``ppo_turn``, ``ppo_bilevel``)."""
    gamma_token: float = 1.0
    """Per-token discount of token-level GAE (``ppo_token``) and within a turn (``ppo_bilevel``)."""
    whiten: bool = True
    """GAE estimators: whiten advantages over the batch (mean 0, std 1 over response tokens)."""
    values: ValueInputs | None = None
    """Critic predictions for this batch (trainer-filled); estimators with ``needs_critic`` require them."""
    baseline_rewards: tuple[float, ...] | None = None
    """Per group, the episode reward of one greedy rollout of its task (trainer-filled for ``needs_greedy_baseline``)."""


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
    """Decorator registering ``fn`` under ``name``. A duplicate name is an error."""

    def deco(fn: Estimator) -> Estimator:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered; registered: {available_estimators()}")
        _REGISTRY[name] = fn
        return fn

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
