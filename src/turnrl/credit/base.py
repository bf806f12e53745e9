"""The estimator contract: one signature, one registry.

Every advantage estimator is a plain function

    estimator(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages

registered by name with ``@register_estimator("name")``. The training loop looks it up with
``get_estimator(cfg.algo.estimator)`` and never asks which one it holds.

Output layout (``Advantages``): one list per trajectory, in flattened group order
``[t for g in groups for t in g.trajectories]``, holding one float per turn of that trajectory. The
trainer broadcasts a turn's advantage over that turn's response tokens (the model's own tokens).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from turnrl.types import TrajectoryGroup

Advantages = list[list[float]]
"""One list per trajectory (flattened group order), one float per turn."""


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


class Estimator(Protocol):
    def __call__(self, groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages: ...


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
    return [[float(a)] * t.num_turns for a, t in zip(per_traj.tolist(), trajs)]
