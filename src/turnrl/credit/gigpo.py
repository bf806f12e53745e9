"""GiGPO: group-in-group credit, episode-level plus anchor-state step-level advantages."""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np

from turnrl.credit.base import Advantages, CreditParams, register_estimator
from turnrl.credit.outcome import grpo
from turnrl.credit.turn import turn_returns
from turnrl.types import TrajectoryGroup


@register_estimator("gigpo")
def gigpo(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    r"""Group-in-Group Policy Optimization (Feng et al. 2025, arXiv:2505.10978).

    Within a group (copies of one task), trajectories revisit the same environment states. GiGPO adds to
    GRPO's episode-level advantage a step-level one that compares the actions taken *from the same state*:

        A^E_i     = (R_i - mean_j R_j) / (std_j R_j + eps)                 episode level (this module's ``grpo``)
        G_{i,t}   = sum_{k >= t} gamma^(k - t) r_{i,k}                     discounted return of turn t
        A^S_{i,t} = (G_{i,t} - mean_{(j,s) in S} G_{j,s}) / (std_S + eps)  S = turns of the group whose anchor
                                                                            state equals turn (i,t)'s
        A_{i,t}   = A^E_i + w * A^S_{i,t}                                   w = ``params.step_weight``

    ``norm_std=False`` drops both std divisions (the paper's "mean-only" normalisation). The anchor of a
    turn is ``Turn.anchor``, the env's key of the state the model acted in (exact match; turns without an
    anchor get no step-level term). Conventions where implementations differ: std is the sample (ddof=1)
    std, as in ``grpo``; an anchor group with one member, or whose returns are all equal, gives
    A^S = 0; returns are computed from the turn rewards only (observation spans carry no reward, so a
    running return never "crosses" them). Deviation from the paper: the paper's step-level groups use the
    returns of the *next* states' discounted rewards exactly as here, but its released code counts only
    steps before termination; here every recorded turn is counted, including the terminal one.
    """
    episode = grpo(groups, params)
    out: Advantages = []
    offset = 0
    for g in groups:
        returns = [turn_returns([turn.reward for turn in t.turns], params.gamma) for t in g.trajectories]
        buckets: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for i, traj in enumerate(g.trajectories):
            for t, turn in enumerate(traj.turns):
                if turn.anchor is not None:
                    buckets[turn.anchor].append((i, t))
        step = [[0.0] * len(rs) for rs in returns]
        for members in buckets.values():
            vals = np.asarray([returns[i][t] for i, t in members], dtype=np.float64)
            if len(members) < 2 or vals.max() == vals.min():
                continue
            centred = vals - vals.mean()
            if params.norm_std:
                centred = centred / (vals.std(ddof=1) + params.eps)
            for (i, t), a in zip(members, centred):
                step[i][t] = float(a)
        for i in range(len(g.trajectories)):
            out.append([e + params.step_weight * s for e, s in zip(episode[offset + i], step[i])])
        offset += len(g.trajectories)
    return out
