"""REINFORCE++: per-turn returns whitened over the whole batch instead of within each group."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from turnrl.credit.base import CreditParams, register_estimator
from turnrl.credit.turn import turn_returns
from turnrl.types import Advantages, TrajectoryGroup


def _whiten(groups: Sequence[TrajectoryGroup], returns: list[list[float]], params: CreditParams) -> Advantages:
    flat = np.asarray([x for rs in returns for x in rs], dtype=np.float64)
    if flat.size == 0:
        return Advantages([[] for _ in returns])
    if not np.all(np.isfinite(flat)):
        raise ValueError("a turn reward is not finite")
    mean = flat.mean()
    if flat.size < 2 or flat.max() == flat.min():
        return Advantages([[0.0] * len(rs) for rs in returns])
    scale = (flat.std() + params.eps) if params.norm_std else 1.0
    return Advantages([[float((x - mean) / scale) for x in rs] for rs in returns])


@register_estimator("reinforce_pp")
def reinforce_pp(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    r"""REINFORCE++ (Hu 2025, arXiv:2501.03262): global-batch whitening of discounted returns.

        G_{i,t} = sum_{k >= t} gamma^(k - t) r_{i,k}
        A_{i,t} = (G_{i,t} - mean_B G) / (std_B G + eps)      B = every turn of every trajectory in the batch

    No group baseline: trajectories of different tasks share one mean and std, which is what makes it
    robust when a group's rewards are all equal (its turns still get a signal relative to the batch).
    Conventions: population std (as OpenRLHF's ``masked_whiten``), ``norm_std=False`` only centres. The
    paper folds a per-token KL penalty into the reward; here KL stays a separate loss term
    (``algo.kl_coef``), so the estimator sees env rewards only.
    """
    returns = [turn_returns([turn.reward for turn in t.turns], params.gamma) for g in groups for t in g.trajectories]
    return _whiten(groups, returns, params)


@register_estimator("reinforce_pp_baseline")
def reinforce_pp_baseline(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    r"""REINFORCE++ with a group baseline (OpenRLHF's ``reinforce_baseline``).

        G'_{i,t} = G_{i,t} - mean_{(j,s) in group} G_{j,s}          subtract the group's mean turn return
        A_{i,t}  = (G'_{i,t} - mean_B G') / (std_B G' + eps)         then whiten over the batch

    The group mean removes the task's difficulty (as GRPO does) while the batch-level std avoids GRPO's
    blow-up on near-constant groups. A singleton group's turns get G' = 0 before whitening.
    """
    centred: list[list[float]] = []
    for g in groups:
        returns = [turn_returns([turn.reward for turn in t.turns], params.gamma) for t in g.trajectories]
        pool = [x for rs in returns for x in rs]
        mean = float(np.mean(pool)) if len(g.trajectories) > 1 and pool else None
        centred.extend([[x - mean if mean is not None else 0.0 for x in rs] for rs in returns])
    return _whiten(groups, centred, params)
