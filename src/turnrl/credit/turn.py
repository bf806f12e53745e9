"""Turn-level estimator: per-turn discounted returns normalised within the group."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from turnrl.credit.base import CreditParams, register_estimator
from turnrl.types import Advantages, TrajectoryGroup


def turn_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """Discounted reward-to-go ``G_t = sum_{k>=t} gamma^(k-t) r_k`` for one trajectory's turn rewards."""
    out = [0.0] * len(rewards)
    g = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        g = float(rewards[t]) + gamma * g
        out[t] = g
    return out


@register_estimator("grpo_turn")
def grpo_turn(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    r"""Group-normalised per-turn returns: GRPO's baseline applied to reward-to-go instead of the episode reward.

    For turn t of trajectory i, with turn rewards r_{i,0..T_i-1} (``Turn.reward``):

        G_{i,t} = sum_{k >= t} gamma^(k - t) r_{i,k}
        A_{i,t} = (G_{i,t} - mean(P)) / (std(P) + eps)     if params.norm_std
        A_{i,t} =  G_{i,t} - mean(P)                       otherwise

    where P is the pool of *all* turns' returns in the group ({G_{j,s}} over every trajectory j and turn s).

    Why pool across turns rather than compare turn t with turn t of the other copies: in multi-turn
    episodes of different lengths, the t-th turns of two copies are not comparable states, and late turn
    indices are reached by only a few copies (often one, which would leave no baseline at all). The pool is
    turn-weighted: a longer trajectory contributes more returns to the baseline. For a baseline keyed on
    *repeated states* rather than positions, see GiGPO's anchor-state grouping (not implemented here).

    Conventions: ``std`` is the sample (ddof=1) std over the pool, as in ``grpo``. A group with fewer than
    two trajectories or fewer than two turns in total, or whose pooled returns are all equal, gets 0 on
    every turn. Relation to ``grpo``: with reward only on the last turn, gamma = 1, equal episode lengths
    and ``norm_std=False`` the two coincide; with ``norm_std=True`` they differ by the ddof of the pool.
    This estimator is not from a single paper; it is the "process supervision" form of DeepSeekMath's GRPO
    (arXiv:2402.03300, sec. 4.1.3) with turn rewards as the process rewards, except that the paper sums
    normalised rewards while this normalises the discounted sums.
    """
    out: list[list[float]] = []
    for g in groups:
        returns = [turn_returns([turn.reward for turn in t.turns], params.gamma) for t in g.trajectories]
        pool = np.asarray([x for rs in returns for x in rs], dtype=np.float64)
        if not np.all(np.isfinite(pool)):
            raise ValueError(f"group seed={g.seed} has a non-finite turn reward")
        if len(g.trajectories) < 2 or pool.size < 2 or pool.max() == pool.min():
            out.extend([[0.0] * len(rs) for rs in returns])
            continue
        mean = pool.mean()
        scale = (pool.std(ddof=1) + params.eps) if params.norm_std else 1.0
        out.extend([[float((x - mean) / scale) for x in rs] for rs in returns])
    return Advantages(out)
