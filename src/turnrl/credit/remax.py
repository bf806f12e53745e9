"""ReMax: REINFORCE with the greedy rollout's reward as the baseline."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from turnrl.credit.base import CreditParams, broadcast_to_turns, episode_rewards, register_estimator
from turnrl.types import Advantages, TrajectoryGroup


@register_estimator("remax")
def remax(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    r"""ReMax (Li et al. 2023, arXiv:2310.10505): the baseline of a task is the reward of its greedy rollout.

        A_i = R_i - R_greedy(task)          every turn of trajectory i gets A_i

    ``params.baseline_rewards[g]`` is the episode reward of one greedy (temperature 0) episode of group g's
    task under the current policy; the trainer collects it because this estimator declares
    ``needs_greedy_baseline = True``. The greedy episode itself is not trained on.

    Conventions and deviations: the paper uses one sampled response per prompt; with ``group_size > 1``
    every copy shares the same greedy baseline (still unbiased: the baseline does not depend on the
    sample). The whole multi-turn episode is the "response" and its summed reward the score. A group whose
    greedy episode ended in an env error (baseline None) has no baseline and gets 0, like a singleton group
    of the group-relative estimators. ``norm_std`` / ``eps`` / ``gamma`` are ignored (ReMax does not normalise).
    """
    if not groups:
        return Advantages([])
    if params.baseline_rewards is None:
        raise ValueError("estimator 'remax' needs params.baseline_rewards (one greedy episode reward per group); "
                         "the trainer fills it when the estimator declares needs_greedy_baseline")
    if len(params.baseline_rewards) != len(groups):
        raise ValueError(f"{len(groups)} groups but {len(params.baseline_rewards)} greedy baseline rewards")
    adv = [0.0 if b is None else r - float(b) for rs, b in zip(episode_rewards(groups), params.baseline_rewards) for r in rs]
    return broadcast_to_turns(groups, np.asarray(adv, dtype=np.float64))


remax.needs_greedy_baseline = True  # type: ignore[attr-defined]
