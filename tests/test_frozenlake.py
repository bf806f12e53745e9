"""FrozenLake keeps Gymnasium's semantics, parses free text, and its oracle solves every seeded map."""

import collections

import pytest

from turnrl.envs import check_env, make
from turnrl.envs.frozenlake import MAPS, FrozenLake, shortest_path
from turnrl.envs.parsing import parse_actions


def test_standard_maps_match_gymnasium():
    assert MAPS["4x4"] == ["SFFF", "FHFH", "FFFH", "HFFG"]
    assert MAPS["8x8"][0] == "SFFFFFFF" and MAPS["8x8"][-1] == "FFFHFFFG" and len(MAPS["8x8"]) == 8


def test_wall_stays_in_place_hole_and_goal_terminate():
    env = FrozenLake(map_name="4x4")
    env.reset(seed=0)
    _, r, term, trunc, info = env.step("Up")
    assert env.pos == (0, 0) and r == 0.0 and not term and not trunc and info["valid"]
    env.step("Right")
    _, r, term, _, info = env.step("Down")  # (1,1) is a hole
    assert term and r == 0.0 and not info["success"]
    env.reset(seed=0)
    for a in shortest_path(MAPS["4x4"], (0, 0)):
        _, r, term, _, info = env.step(a)
    assert term and r == 1.0 and info["success"] and info["reward_components"] == {"outcome": 1.0}


def test_slippery_moves_as_intended_or_sideways_never_backwards():
    env = FrozenLake(desc=["FFF", "FSF", "FFG"], slippery=True)
    counts = collections.Counter()
    for seed in range(900):
        env.reset(seed=seed)
        env.step("Up")
        counts[env.pos] += 1
    # from (1,1): Up -> (0,1); Left -> (1,0); Right -> (1,2); never Down -> (2,1)
    assert set(counts) == {(0, 1), (1, 0), (1, 2)}
    for pos in counts:
        assert abs(counts[pos] / 900 - 1 / 3) < 0.06


@pytest.mark.parametrize("seed", range(50))
def test_random_maps_are_solvable_and_the_oracle_solves_them(seed):
    env = make("frozenlake-v0")
    env.reset(seed=seed)
    plan = env.solve()
    assert plan is not None and len(plan) <= 8
    for a in plan:
        _, _, term, trunc, info = env.step(a)
    assert term and info["success"]


def test_random_maps_depend_on_seed_only():
    a, b = FrozenLake(), FrozenLake()
    assert a.reset(seed=5) == b.reset(seed=5)
    assert len({FrozenLake().reset(seed=s)[0] for s in range(20)}) > 10


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>Right</answer>", ["Right"]),
        ("Right", ["Right"]),
        ("right.", ["Right"]),
        ("I think I will move UP now", ["Up"]),
        ("Left or Down? <answer>down</answer>", ["Down"]),
        ("Rightward", []),
        ("", []),
        ("\x00garbage###", []),
    ],
)
def test_action_parsing(text, expected):
    assert parse_actions(text, ("Left", "Down", "Right", "Up"), limit=1) == expected


def test_several_actions_per_turn_up_to_the_limit():
    assert parse_actions("Down, Down, Right, Up", ("Left", "Down", "Right", "Up"), limit=3) == ["Down", "Down", "Right"]
    env = FrozenLake(map_name="4x4", max_actions_per_turn=2)
    env.reset(seed=0)
    _, _, _, _, info = env.step("Down Down Right")
    assert info["actions"] == ["Down", "Down"] and env.pos == (2, 0)


def test_invalid_text_gets_feedback_not_an_exception():
    env = make("frozenlake-v0", invalid_penalty=0.25)
    obs0, _ = env.reset(seed=1)
    obs, r, term, trunc, info = env.step("I refuse to play")
    assert "Invalid action" in obs and obs0 in obs and r == -0.25 and not info["valid"]
    assert info["reward_components"] == {"outcome": 0.0, "invalid_penalty": -0.25}


def test_observation_is_compact_and_hints_describe_neighbours():
    env = FrozenLake(map_name="4x4")
    obs, _ = env.reset(seed=0)
    assert obs == "PFFF\nFHFH\nFFFH\nHFFG\nLeft: wall, Down: frozen, Right: frozen, Up: wall"
    assert FrozenLake(map_name="4x4", show_hints=False).reset(seed=0)[0] == "PFFF\nFHFH\nFFFH\nHFFG"


def test_anchor_is_state_without_history():
    env = FrozenLake(map_name="4x4")
    env.reset(seed=0)
    start = env.anchor()
    env.step("Right")
    env.step("Left")
    assert env.anchor() == start


def test_examples_are_oracle_moves_on_fixed_maps():
    ex = FrozenLake().examples()
    assert [resp for _, resp in ex] == ["Down", "Right"]


@pytest.mark.parametrize("kwargs", [{}, {"map_name": "8x8", "max_turns": 20}, {"slippery": True}])
def test_check_env(kwargs):
    check_env("frozenlake-v0", check_solve=not kwargs.get("slippery", False), **kwargs)


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="map_name"):
        FrozenLake(map_name="5x5")
    with pytest.raises(TypeError, match="Did you mean 'slippery'"):
        make("frozenlake-v0", slipery=True)
