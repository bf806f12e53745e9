"""ReMax: the greedy rollout's reward is the baseline."""

from __future__ import annotations

import pytest

from turnrl import credit
from turnrl.credit import CreditParams, estimator_flag
from turnrl.types import Trajectory, TrajectoryGroup, Turn


def _group(rewards, seed=0):
    trajs = [Trajectory("e", seed, [Turn([1], [2], [-0.1], "o", "r", reward=0.0), Turn([1], [2], [-0.1], "o", "r", reward=r)])
             for r in rewards]
    return TrajectoryGroup("e", seed, trajs)


def test_baseline_is_greedy_reward_per_group():
    adv = credit.remax([_group([1.0, 0.0]), _group([0.5])], CreditParams(baseline_rewards=(0.25, 1.0)))
    assert adv == [[0.75, 0.75], [-0.25, -0.25], [-0.5, -0.5]]


def test_needs_the_greedy_baseline():
    assert estimator_flag(credit.get_estimator("remax"), "needs_greedy_baseline")
    assert not estimator_flag(credit.get_estimator("grpo"), "needs_greedy_baseline")
    with pytest.raises(ValueError, match="baseline_rewards"):
        credit.remax([_group([1.0])], CreditParams())
    with pytest.raises(ValueError, match="1 groups but 2"):
        credit.remax([_group([1.0])], CreditParams(baseline_rewards=(0.0, 1.0)))
