"""REINFORCE++: per-turn returns whitened over the whole batch instead of within each group."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from turnrl.credit.base import CreditParams, batch_std, register_estimator
from turnrl.credit.turn import turn_returns
from turnrl.types import Advantages, TrajectoryGroup


def _whiten(returns: list[list[float]], params: CreditParams) -> Advantages:
    """(G - mean_B G) / (std_B G + eps) over every turn of the batch (only centred without ``norm_std``);
    a batch of fewer than two turns, or of equal returns, gets 0."""
    flat = np.asarray([x for rs in returns for x in rs], dtype=np.float64)
    if not np.all(np.isfinite(flat)):
        raise ValueError("a turn reward is not finite")
    if flat.size < 2 or flat.max() == flat.min():
        return Advantages([[0.0] * len(rs) for rs in returns])
    mean = flat.mean()
    scale = (batch_std(flat, params) + params.eps) if params.norm_std else 1.0
    return Advantages([[float((x - mean) / scale) for x in rs] for rs in returns])


@register_estimator("reinforce_pp")
def reinforce_pp(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    r"""REINFORCE++ (Hu 2025, arXiv:2501.03262): global-batch whitening of discounted returns.

        G_{i,t} = sum_{k >= t} gamma^(k - t) r_{i,k}
        A_{i,t} = (G_{i,t} - mean_B G) / (std_B G + eps)      B = every turn of every trajectory in the batch

    No group baseline: trajectories of different tasks share one mean and std, which is what makes it
    robust when a group's rewards are all equal (its turns still get a signal relative to the batch).
    Conventions: the std is ``params.whiten_std`` (:func:`turnrl.credit.base.batch_std`): ``population`` by
    default, as OpenRLHF normalises REINFORCE++ advantages, or ``unbiased``, as verl's ``masked_whiten``;
    ``norm_std=False`` only centres. Statistics are per turn, not per token as in OpenRLHF (every token of a
    turn shares its advantage, so OpenRLHF's token-weighted statistics would weight long responses more).
    The paper folds a per-token KL penalty into the reward; here KL stays a separate loss term
    (``algo.kl_coef``), so the estimator sees env rewards only.
    """
    returns = [turn_returns([turn.reward for turn in t.turns], params.gamma) for g in groups for t in g.trajectories]
    return _whiten(returns, params)


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
    return _whiten(centred, params)
