"""Batch shaping for sparse rewards: which groups and turns carry a policy gradient at all.

These run between the estimator and the learner, so they work with every estimator:

- :func:`keep_informative_groups`: variance-based group filtering. Groups whose episode rewards barely
  differ carry almost no signal under group-relative estimators; keep the ``fraction`` with the largest
  reward spread (DAPO's dynamic-sampling filter drops only the zero-variance ones; this keeps a top share).
- :func:`mask_overlong`: zero the advantage of turns whose response hit the token limit, so a cut-off
  response is neither rewarded nor punished for text it never finished (DAPO's overlong filtering).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from turnrl.credit.base import without_env_errors
from turnrl.types import Advantages, TrajectoryGroup


def keep_informative_groups(groups: Sequence[TrajectoryGroup], fraction: float) -> list[bool]:
    """Per group, whether to train on it: the ``ceil(fraction * n)`` groups with the largest reward std.

    The std is over the group's trajectories that are trained on (env errors are left out, as the estimators
    leave them out). Groups with zero reward variance are never kept (they have no group-relative signal).
    Ties keep the earlier group, so the choice is deterministic. ``fraction = 1`` keeps every group with any variance.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction={fraction} must be in (0, 1]")
    spread = [float(np.std(g.rewards)) if len(g.trajectories) > 1 else 0.0 for g in without_env_errors(groups)]
    order = sorted(range(len(groups)), key=lambda i: (-spread[i], i))
    budget = math.ceil(fraction * len(groups))
    keep = [False] * len(groups)
    for i in order[:budget]:
        keep[i] = spread[i] > 0.0
    return keep


def apply_group_mask(groups: Sequence[TrajectoryGroup], advantages: Advantages, keep: Sequence[bool]) -> Advantages:
    """Zero the advantages of every trajectory in a dropped group (flattened order, as estimators return)."""
    kept = [k for g, k in zip(groups, keep) for _ in g.trajectories]
    return advantages.masked(lambda i, j: kept[i])


def mask_overlong(groups: Sequence[TrajectoryGroup], advantages: Advantages) -> Advantages:
    """Zero the advantage of each turn whose response was cut by the per-turn token limit."""
    trajs = [t for g in groups for t in g.trajectories]
    return advantages.masked(lambda i, j: trajs[i].turns[j].finish_reason != "length")
