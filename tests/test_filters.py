import pytest

from turnrl.credit.filters import apply_group_mask, keep_informative_groups, mask_overlong
from turnrl.types import Advantages, Termination, Trajectory, TrajectoryGroup, Turn


def _group(rewards, finish=None):
    trajs = [Trajectory("e", 0, [Turn([], [1], [0.0], "o", "r", reward=r, finish_reason=(finish or "stop"))]) for r in rewards]
    return TrajectoryGroup("e", 0, trajs)


def test_keeps_the_groups_with_the_largest_spread_and_never_a_constant_one():
    groups = [_group([0, 0]), _group([0, 1]), _group([0, 0.5]), _group([1, 1])]
    assert keep_informative_groups(groups, 0.5) == [False, True, True, False]
    assert keep_informative_groups(groups, 0.25) == [False, True, False, False]
    assert keep_informative_groups(groups, 1.0) == [False, True, True, False]
    with pytest.raises(ValueError):
        keep_informative_groups(groups, 0.0)


def test_apply_group_mask_zeroes_whole_groups_in_flattened_order():
    groups = [_group([0, 1]), _group([1, 1])]
    adv = Advantages([[0.5], [-0.5], [0.2], [0.3]])
    assert apply_group_mask(groups, adv, [False, True]).turns == [[0.0], [0.0], [0.2], [0.3]]
    tokens = Advantages.per_token([[[0.5]], [[-0.5]], [[0.2]], [[0.3]]])
    assert apply_group_mask(groups, tokens, [False, True]).tokens == [[[0.0]], [[0.0]], [[0.2]], [[0.3]]]


def test_mask_overlong_zeroes_only_cut_turns():
    groups = [_group([1.0, 0.0], finish="length"), _group([1.0, 0.0])]
    assert mask_overlong(groups, Advantages([[1.0], [-1.0], [1.0], [-1.0]])).turns == [[0.0], [0.0], [1.0], [-1.0]]


def test_env_errors_do_not_count_towards_a_groups_spread():
    steady = _group([1.0, 1.0])
    steady.trajectories.append(Trajectory("e", 0, [Turn([], [1], [0.0], "o", "r", reward=0.0)], Termination.ENV_ERROR))
    assert keep_informative_groups([steady, _group([0.0, 1.0])], 1.0) == [False, True]
