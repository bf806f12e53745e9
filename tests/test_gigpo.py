"""GiGPO on hand-computed cases."""

import pytest

from turnrl.credit import CreditParams, get_estimator
from turnrl.types import Trajectory, TrajectoryGroup, Turn


def _traj(anchors, rewards):
    turns = [Turn([], [1], [0.0], "o", "r", reward=r, anchor=a) for a, r in zip(anchors, rewards)]
    return Trajectory("e", 0, turns)


def _group():
    # A visits s0 -> s1 and earns 1 at the end; B visits s0 -> s2 and earns nothing.
    return TrajectoryGroup("e", 0, [_traj(["s0", "s1"], [0.0, 1.0]), _traj(["s0", "s2"], [0.0, 0.0])])


gigpo = get_estimator("gigpo")


def test_mean_only_hand_values():
    # episode: R = [1, 0] -> +-0.5; step: only s0 is shared, returns 1 vs 0 -> +-0.5; s1, s2 singletons -> 0
    adv = gigpo([_group()], CreditParams(norm_std=False, gamma=1.0, step_weight=1.0)).turns
    assert adv == [[1.0, 0.5], [-1.0, -0.5]]


def test_std_normalised_hand_values():
    adv = gigpo([_group()], CreditParams(norm_std=True, gamma=1.0, step_weight=1.0, eps=0.0)).turns
    r = 2 ** -0.5  # (1 - 0.5) / sample std of [1, 0]
    assert adv[0] == pytest.approx([2 * r, r]) and adv[1] == pytest.approx([-2 * r, -r])


def test_discount_and_weight():
    # gamma = 0.5: A's return at s0 is 0.5 -> step advantages +-0.25, weighted by w = 2 -> +-0.5
    adv = gigpo([_group()], CreditParams(norm_std=False, gamma=0.5, step_weight=2.0)).turns
    assert adv == [[1.0, 0.5], [-1.0, -0.5]]
    adv = gigpo([_group()], CreditParams(norm_std=False, gamma=0.5, step_weight=0.0)).turns
    assert adv == [[0.5, 0.5], [-0.5, -0.5]]  # w = 0 is GRPO (Dr.GRPO here)


def test_anchors_do_not_cross_groups_and_missing_anchors_get_no_step_term():
    other = TrajectoryGroup("e", 1, [_traj(["s0", None], [5.0, 0.0]), _traj(["s0", None], [5.0, 0.0])])
    adv = gigpo([_group(), other], CreditParams(norm_std=False)).turns
    assert adv[:2] == [[1.0, 0.5], [-1.0, -0.5]]  # the other group's s0 is a different task's state
    assert adv[2:] == [[0.0, 0.0], [0.0, 0.0]]


def test_repeated_state_within_one_trajectory_is_grouped():
    # C stays on s0 twice (a wall bump) before succeeding; D leaves s0 and fails
    g = TrajectoryGroup("e", 0, [_traj(["s0", "s0"], [0.0, 1.0]), _traj(["s0", "s3"], [0.0, 0.0])])
    adv = gigpo([g], CreditParams(norm_std=False, gamma=1.0, step_weight=1.0)).turns
    # s0 returns: C0 = 1, C1 = 1, D0 = 0 -> mean 2/3
    assert adv[0] == pytest.approx([0.5 + 1 / 3, 0.5 + 1 / 3]) and adv[1] == pytest.approx([-0.5 - 2 / 3, -0.5])


def test_episode_pooling_over_trajectories_or_over_step_rows():
    # A takes 3 steps and earns R = 1, B takes 1 step and earns 0; no shared anchor, so only the episode term is left.
    g = TrajectoryGroup("e", 0, [_traj(["a0", "a1", "a2"], [0.0, 0.0, 1.0]), _traj(["b0"], [0.0])])
    # trajectory pool {1, 0}: mean 1/2, sample std sqrt(1/2) -> +-(1/2) / sqrt(1/2) = +-sqrt(1/2)
    # step pool {1, 1, 1, 0}: mean 3/4, sample variance (3 * (1/4)^2 + (3/4)^2) / 3 = 1/4, std 1/2 -> 1/2 and -3/2
    traj = gigpo([g], CreditParams(eps=0.0)).turns
    assert traj[0] == pytest.approx([2 ** -0.5] * 3) and traj[1] == pytest.approx([-(2 ** -0.5)])
    step = gigpo([g], CreditParams(eps=0.0, gigpo_pooling="step")).turns
    assert step[0] == pytest.approx([0.5] * 3) and step[1] == pytest.approx([-1.5])
    mean_only = gigpo([g], CreditParams(norm_std=False, gigpo_pooling="step")).turns
    assert mean_only == [[0.25] * 3, [-0.75]]  # centred on the step-weighted mean 3/4
    assert gigpo([g], CreditParams(norm_std=False)).turns == [[0.5] * 3, [-0.5]]
    with pytest.raises(ValueError, match="'trajectory' or 'step'"):
        gigpo([g], CreditParams(gigpo_pooling="steps"))
