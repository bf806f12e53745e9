import pytest

from turnrl.credit.rewards import apply_process_rewards, clip_rewards, load_prm
from turnrl.types import Trajectory, TrajectoryGroup, Turn


def _groups():
    turns = [Turn([], [1], [0.0], "o", "Right", reward=0.0, reward_components={"outcome": 0.0}),
             Turn([], [1], [0.0], "o", "blah", reward=5.0, reward_components={"outcome": 5.0})]
    return [TrajectoryGroup("e", 0, [Trajectory("e", 0, turns)])]


def length_prm(traj, t):
    return 1.0 if traj.turns[t].response_text == "Right" else -1.0


def test_process_rewards_add_a_named_component_per_turn():
    groups = _groups()
    apply_process_rewards(groups, length_prm, weight=0.5)
    turns = groups[0].trajectories[0].turns
    assert [t.reward for t in turns] == [0.5, 4.5]
    assert turns[1].reward_components == {"outcome": 5.0, "prm": -0.5}
    assert all(abs(sum(t.reward_components.values()) - t.reward) < 1e-12 for t in turns)


def test_load_prm_by_path_and_clear_errors():
    assert load_prm("tests.test_rewards:length_prm") is length_prm
    with pytest.raises(ValueError, match="package.module:function"):
        load_prm("nocolon")
    with pytest.raises(ValueError, match="no callable"):
        load_prm("tests.test_rewards:missing")


def test_clip_records_the_change():
    groups = _groups()
    clip_rewards(groups, 1.0)
    t = groups[0].trajectories[0].turns[1]
    assert t.reward == 1.0 and t.reward_components == {"outcome": 5.0, "clip": -4.0}
