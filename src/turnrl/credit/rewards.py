"""Turn-reward transforms applied before credit assignment: process-reward models and clipping.

Both edit ``Turn.reward`` in place and record the change as its own named component in
``Turn.reward_components``, so components still sum to the reward and each change is logged separately
(``rollout/reward/prm``, ``rollout/reward/clip``).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence

from turnrl.types import Trajectory, TrajectoryGroup

ProcessRewardModel = Callable[[Trajectory, int], float]
"""Scores turn ``t`` of a trajectory (observation, response, actions, env reward are all on the Turn)."""


def load_prm(spec: str) -> ProcessRewardModel:
    """Import a process-reward model from ``"package.module:function"``."""
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"algo.prm={spec!r} must look like 'package.module:function'")
    fn = getattr(importlib.import_module(module), attr, None)
    if not callable(fn):
        raise ValueError(f"algo.prm={spec!r}: {module} has no callable {attr!r}")
    return fn


def apply_process_rewards(groups: Sequence[TrajectoryGroup], prm: ProcessRewardModel, weight: float) -> None:
    """Add ``weight * prm(trajectory, t)`` to every turn's reward, as component ``prm``.

    The PRM's scores combine additively with the env's outcome and step rewards; any estimator that reads
    per-turn rewards (``grpo_turn``, ``gigpo``, ``reinforce_pp``) then credits each turn with them, and the
    episode-level ones see them through the episode sum.
    """
    for g in groups:
        for traj in g.trajectories:
            for t, turn in enumerate(traj.turns):
                score = float(prm(traj, t))
                if not math.isfinite(score):
                    raise ValueError(f"the process-reward model returned {score} for seed {traj.seed} turn {t}")
                turn.reward += weight * score
                turn.reward_components["prm"] = turn.reward_components.get("prm", 0.0) + weight * score


def clip_rewards(groups: Sequence[TrajectoryGroup], bound: float) -> None:
    """Clip every turn reward to [-bound, bound]; the change is recorded as component ``clip``."""
    if bound <= 0:
        raise ValueError(f"reward clip bound {bound} must be > 0")
    for g in groups:
        for traj in g.trajectories:
            for turn in traj.turns:
                clipped = min(bound, max(-bound, turn.reward))
                if clipped != turn.reward:
                    turn.reward_components["clip"] = turn.reward_components.get("clip", 0.0) + clipped - turn.reward
                    turn.reward = clipped
