"""Outcome-level estimators: one advantage per trajectory, given to every one of its turns.

Both use the episode reward ``R_i = trajectory.total_reward`` (outcome plus any step rewards and
penalties, summed over turns) and a baseline built from the other copies of the same task (the group),
so no critic is needed. Computation is vectorised over the whole batch (groups may differ in size).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from turnrl.credit.base import (
    CreditParams,
    broadcast_to_turns,
    episode_rewards,
    flat_group_index,
    register_estimator,
)
from turnrl.types import Advantages, TrajectoryGroup


def _group_stats(
    groups: Sequence[TrajectoryGroup], weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Flat rewards, group ids, group sizes, group sums and a per-trajectory "no baseline" flag.

    ``weights`` (one per trajectory, default 1) says how many members of the pool a trajectory is: sizes are
    sums of weights and sums are weighted. The flag is set for trajectories whose group pools fewer than two
    members or whose members (weight > 0) all have the same reward; their advantage is exactly 0 (checked
    with max == min, not with a float std that may come out 1e-17).
    """
    r = np.asarray([x for rs in episode_rewards(groups) for x in rs], dtype=np.float64)
    w = np.ones_like(r) if weights is None else np.asarray(weights, dtype=np.float64)
    gid = flat_group_index(groups)
    n_groups = len(groups)
    k = np.bincount(gid, weights=w, minlength=n_groups)
    s = np.bincount(gid, weights=w * r, minlength=n_groups)
    hi = np.full(n_groups, -np.inf)
    lo = np.full(n_groups, np.inf)
    np.maximum.at(hi, gid, np.where(w > 0, r, -np.inf))
    np.minimum.at(lo, gid, np.where(w > 0, r, np.inf))
    degenerate = ((k < 2) | (hi == lo))[gid]
    return r, gid, k, s, degenerate


def group_normalised(
    groups: Sequence[TrajectoryGroup], params: CreditParams, weights: np.ndarray | None = None
) -> np.ndarray:
    """Per trajectory (flattened order), GRPO's ``(R_i - mean) / (std + eps)`` (``R_i - mean`` without ``norm_std``)
    over its group's pool, where trajectory i is ``weights[i]`` members of the pool (default 1):

        mean = sum_j w_j R_j / n,   std = sqrt(sum_j w_j (R_j - mean)^2 / (n - 1)),   n = sum_j w_j

    and 0 where the pool has no baseline (see :func:`_group_stats`).
    """
    r, gid, k, s, degenerate = _group_stats(groups, weights)
    if r.size == 0:
        return r
    w = 1.0 if weights is None else np.asarray(weights, dtype=np.float64)
    mean = s / np.maximum(k, 1.0)
    centred = r - mean[gid]
    if params.norm_std:
        var = np.bincount(gid, weights=w * centred * centred, minlength=len(groups)) / np.maximum(k - 1.0, 1.0)
        centred = centred / (np.sqrt(var)[gid] + params.eps)
    return np.where(degenerate, 0.0, centred)


@register_estimator("grpo")
def grpo(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    r"""GRPO outcome advantage (DeepSeekMath, arXiv:2402.03300, sec. 4.1.2 "outcome supervision").

    For trajectory i in a group of k copies with episode rewards R_1..R_k:

        A_i = (R_i - mean(R)) / (std(R) + eps)      if params.norm_std   (GRPO)
        A_i =  R_i - mean(R)                        otherwise            (Dr.GRPO, arXiv:2503.20783)

    and every turn of trajectory i gets A_i.

    Conventions and deviations:

    - ``std`` is the *sample* (Bessel-corrected, ``ddof=1``) standard deviation, as ``torch.std``
      computes it in TRL's ``GRPOTrainer`` and verl's ``compute_grpo_outcome_advantage``; the paper does
      not say which. Matching those implementations keeps hyper-parameters and logged advantages
      comparable. For k = 2 with rewards {0, 1} this gives A = -/+0.7071 (population std would give -/+1).
    - ``eps`` is added to the std (not to the variance), as in TRL and verl.
    - A singleton group (k = 1) has no baseline: its advantage is 0, so it contributes no policy gradient.
    - A group whose rewards are all equal gets exactly 0 (checked as max == min), in both modes. GRPO's
      known side effect remains for *nearly* equal rewards: the std division amplifies tiny differences
      up to O(1) advantages (Dr.GRPO's "question-level difficulty bias"); set ``norm_std=False`` to avoid it.
    - The mean includes R_i itself (as in the paper); ``rloo`` excludes it.
    - ``params.gamma`` is ignored: the advantage is the same for every turn.
    """
    return broadcast_to_turns(groups, group_normalised(groups, params))


@register_estimator("rloo")
def rloo(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    r"""REINFORCE Leave-One-Out advantage (Ahmadian et al., arXiv:2402.14740; Kool et al. 2019).

    For trajectory i in a group of k copies:

        A_i = R_i - (1 / (k - 1)) * sum_{j != i} R_j   =   k / (k - 1) * (R_i - mean(R))

    and every turn of trajectory i gets A_i. The baseline excludes R_i, so the estimator is unbiased.

    Conventions: a singleton group (k = 1) has no leave-one-out baseline and gets 0; an all-equal group
    gets exactly 0. ``params.norm_std``, ``params.eps`` and ``params.gamma`` are ignored (RLOO does not
    normalise by the std). The paper applies RLOO to a single-turn completion; here the whole multi-turn
    episode is the "completion" and its summed reward the score.
    """
    r, gid, k, s, degenerate = _group_stats(groups)
    if r.size == 0:
        return broadcast_to_turns(groups, r)
    kk = k[gid]
    loo_mean = (s[gid] - r) / np.maximum(kk - 1.0, 1.0)
    adv = np.where(degenerate, 0.0, r - loo_mean)
    return broadcast_to_turns(groups, adv)
