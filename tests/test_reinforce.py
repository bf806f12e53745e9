"""REINFORCE++ and its group-baseline variant on hand-computed cases."""

import pytest

from turnrl.credit import CreditParams, get_estimator
from turnrl.types import Trajectory, TrajectoryGroup, Turn


def _traj(rewards):
    return Trajectory("e", 0, [Turn([], [1], [0.0], "o", "r", reward=r) for r in rewards])


def test_reinforce_pp_whitens_over_the_whole_batch():
    # two single-trajectory groups (no group baseline possible), one turn each: rewards 1 and 0
    groups = [TrajectoryGroup("e", 0, [_traj([1.0])]), TrajectoryGroup("e", 1, [_traj([0.0])])]
    adv = get_estimator("reinforce_pp")(groups, CreditParams(eps=0.0)).turns
    assert adv == [[1.0], [-1.0]]  # mean 0.5, population std 0.5


def test_reinforce_pp_discounted_turn_returns():
    # returns with gamma 0.5: [0 + 0.5 * 1, 1] = [0.5, 1]; batch {0.5, 1, 0} mean 0.5
    groups = [TrajectoryGroup("e", 0, [_traj([0.0, 1.0]), _traj([0.0])])]
    adv = get_estimator("reinforce_pp")(groups, CreditParams(norm_std=False, gamma=0.5)).turns
    assert adv == [[0.0, 0.5], [-0.5]]


def test_reinforce_pp_baseline_removes_task_difficulty():
    # task A: rewards 3, 1 (mean 2); task B: 10, 10 (mean 10) -> centred 1, -1, 0, 0 -> std sqrt(0.5)
    groups = [TrajectoryGroup("e", 0, [_traj([3.0]), _traj([1.0])]), TrajectoryGroup("e", 1, [_traj([10.0]), _traj([10.0])])]
    adv = get_estimator("reinforce_pp_baseline")(groups, CreditParams(eps=0.0)).turns
    s = 0.5 ** 0.5
    assert [a[0] for a in adv] == pytest.approx([1 / s, -1 / s, 0.0, 0.0])
    plain = get_estimator("reinforce_pp")(groups, CreditParams(eps=0.0)).turns
    assert plain[2][0] > 0 and plain[3][0] > 0  # without the baseline the easy task's turns look good


def test_constant_batch_gives_zero():
    groups = [TrajectoryGroup("e", 0, [_traj([1.0]), _traj([1.0])])]
    for name in ("reinforce_pp", "reinforce_pp_baseline"):
        assert get_estimator(name)(groups, CreditParams()).turns == [[0.0], [0.0]]
