"""FrozenLake keeps Gymnasium's semantics, parses free text, renders compactly, and its oracle solves every map."""

import collections

import pytest

from turnrl.envs import check_env, make
from turnrl.envs.frozenlake import MAPS, FrozenLake, shortest_path
from turnrl.envs.parsing import parse_actions

LDRU = ("Left", "Down", "Right", "Up")


def test_standard_maps_match_gymnasium():
    assert MAPS["4x4"] == ["SFFF", "FHFH", "FFFH", "HFFG"]
    assert MAPS["8x8"] == ["SFFFFFFF", "FFFFFFFF", "FFFHFFFF", "FFFFFHFF", "FFFHFFFF", "FHHFFFHF", "FHFFHFHF", "FFFHFFFG"]
    env = FrozenLake(map_name="8x8")
    env.reset(seed=0)
    assert env.desc == MAPS["8x8"] and env.pos == (0, 0) and len(env.solve()) == 14


def test_wall_stays_in_place_hole_and_goal_terminate():
    env = FrozenLake(map_name="4x4")
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step("Up")
    assert env.pos == (0, 0) and r == 0.0 and not term and not trunc and info["valid"] and info["actions"] == ["Up"]
    env.step("Left")
    assert env.pos == (0, 0)
    env.step("Right")
    obs, r, term, _, info = env.step("Down")  # (1, 1) is a hole
    assert term and r == 0.0 and not info["success"] and obs.endswith("You fell into a hole.")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("Up")
    env.reset(seed=0)
    plan = env.solve()
    assert len(plan) == 6  # the shortest path on Gymnasium's 4x4 map
    for i, a in enumerate(plan):
        obs, r, term, _, info = env.step(a)
        assert term == (i == len(plan) - 1)
    assert r == 1.0 and info["success"] and info["reward_components"] == {"outcome": 1.0}
    assert obs.endswith("You reached the goal.")


@pytest.mark.parametrize(
    "action, outcomes",
    [  # from the centre of a 3x3 map: the intended cell or either perpendicular one, never backwards
        ("Up", {(0, 1), (1, 0), (1, 2)}),
        ("Down", {(2, 1), (1, 0), (1, 2)}),
        ("Left", {(1, 0), (0, 1), (2, 1)}),
        ("Right", {(1, 2), (0, 1), (2, 1)}),
    ],
)
def test_slippery_moves_as_intended_or_sideways_with_one_third_each(action, outcomes):
    env = FrozenLake(desc=["FFF", "FSF", "FFG"], slippery=True)
    n = 600
    env.reset(seed=123)
    counts = collections.Counter()
    for _ in range(n):
        env.reset()  # no seed: the env's own RNG continues
        env.step(action)
        counts[env.pos] += 1
    assert set(counts) == outcomes
    assert all(abs(c / n - 1 / 3) < 0.07 for c in counts.values())


def test_slips_are_seeded():
    def trajectory(seed):
        env = FrozenLake(map_name="8x8", slippery=True)
        env.reset(seed=seed)
        return [env.step("Right")[0] for _ in range(5)]

    assert trajectory(7) == trajectory(7)
    assert len({tuple(trajectory(s)) for s in range(10)}) > 1


@pytest.mark.parametrize("seed", range(50))
def test_random_maps_are_solvable_and_the_oracle_solves_them_in_its_plan_length(seed):
    env = make("frozenlake-v0")
    env.reset(seed=seed)
    desc = env.unwrapped.desc
    assert desc[0][0] == "S" and desc[-1][-1] == "G" and len(desc) == 4
    plan = env.solve()
    assert plan is not None and 6 <= len(plan) <= 8  # at least the Manhattan distance; within the turn limit
    for i, a in enumerate(plan):
        _, _, term, trunc, info = env.step(a)
        assert term == (i == len(plan) - 1) and not trunc
    assert info["success"]


def test_random_maps_depend_on_the_seed_only():
    assert FrozenLake().reset(seed=5) == FrozenLake().reset(seed=5)
    assert len({FrozenLake().reset(seed=s)[0] for s in range(20)}) > 10
    big = FrozenLake(size=6, p_frozen=0.6)
    assert len(big.reset(seed=1)[1]["map"]) == 6 and shortest_path(big.desc, (0, 0)) is not None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>Right</answer>", ["Right"]),
        ("Right", ["Right"]),
        ("right.", ["Right"]),
        ("RIGHT!", ["Right"]),
        ("I think I will move UP now", ["Up"]),
        ("Left or Down? <answer>down</answer>", ["Down"]),  # the tag wins over earlier words
        ("<answer>Left</answer> no, <answer>Up</answer>", ["Up"]),  # the last tag is the answer
        ("<answer>Right", ["Right"]),  # an unclosed tag (cut by the token limit) still parses
        ("Rightward", []),
        ("", []),
        ("\x00garbage###", []),
    ],
)
def test_action_parsing(text, expected):
    assert parse_actions(text, LDRU, limit=1) == expected


def test_several_actions_per_turn_up_to_the_limit():
    assert parse_actions("Down, Down, Right, Up", LDRU, limit=3) == ["Down", "Down", "Right"]
    env = FrozenLake(map_name="4x4", max_actions_per_turn=2)
    env.reset(seed=0)
    _, _, _, _, info = env.step("Down Down Right")
    assert info["actions"] == ["Down", "Down"] and env.pos == (2, 0)
    env.reset(seed=0)
    _, _, term, _, info = env.step("Right Down")  # stops in the hole at (1, 1); the rest of the turn is not executed
    assert term and info["actions"] == ["Right", "Down"]
    env = FrozenLake(map_name="4x4", max_actions_per_turn=3)
    env.reset(seed=0)
    _, _, term, _, info = env.step("Right Down Right")
    assert term and info["actions"] == ["Right", "Down"] and env.pos == (1, 1)


def test_invalid_text_gets_feedback_and_changes_nothing():
    env = make("frozenlake-v0", invalid_penalty=0.25)
    obs0, _ = env.reset(seed=1)
    anchor = env.anchor()
    obs, r, term, trunc, info = env.step("I refuse to play")
    assert obs == "Invalid action. Answer with one of: Left, Down, Right, Up.\n" + obs0
    assert r == -0.25 and not term and not trunc and not info["valid"] and info["actions"] == []
    assert info["reward_components"] == {"outcome": 0.0, "invalid_penalty": -0.25} and env.anchor() == anchor


def test_observation_is_compact_and_hints_describe_neighbours():
    env = FrozenLake(map_name="4x4")
    obs, _ = env.reset(seed=0)
    assert obs == "PFFF\nFHFH\nFFFH\nHFFG\nLeft: wall, Down: frozen, Right: frozen, Up: wall"
    obs, *_ = env.step("Right")
    assert obs.splitlines()[-1] == "Left: frozen, Down: hole, Right: frozen, Up: wall"
    assert FrozenLake(map_name="4x4", show_hints=False).reset(seed=0)[0] == "PFFF\nFHFH\nFFFH\nHFFG"


def test_spaced_grid_and_goal_line():
    env = FrozenLake(map_name="4x4", grid="spaced", show_goal=True)
    obs, _ = env.reset(seed=0)
    assert obs == "P F F F\nF H F H\nF F F H\nH F F G\nLeft: wall, Down: frozen, Right: frozen, Up: wall\nGoal: 3 down, 3 right"
    obs, *_ = env.step("Right")
    assert obs.splitlines()[-2:] == ["Left: frozen, Down: hole, Right: frozen, Up: wall", "Goal: 3 down, 2 right"]
    env = FrozenLake(desc=["GFF", "FFS"], show_goal=True)
    assert env.reset()[0].splitlines()[-1] == "Goal: 1 up, 2 left"
    with pytest.raises(ValueError, match="grid="):
        FrozenLake(grid="fancy")


def test_the_situation_names_neighbours_and_goal_direction_and_no_map():
    env = FrozenLake(map_name="4x4", show_hints=False)  # the situation does not depend on what is shown
    env.reset(seed=0)
    assert env.situation() == "Left: wall, Down: frozen, Right: frozen, Up: wall; goal down-right"
    other = FrozenLake(desc=["FFHF", "FFFF", "SFFF", "FFFG"])  # the map's far cells are in no key
    other.reset(seed=0)
    other.step("Down")
    assert other.situation() == "Left: wall, Down: wall, Right: frozen, Up: frozen; goal right"
    corner = FrozenLake(desc=["GS"])
    corner.reset()
    assert corner.situation() == "Left: goal, Down: wall, Right: wall, Up: wall; goal left"
    corner.step("Left")
    assert corner.situation().endswith("; goal here")


def test_anchor_is_the_state_without_history():
    env = FrozenLake(map_name="4x4")
    env.reset(seed=0)
    start = env.anchor()
    env.step("Right")
    assert env.anchor() != start
    env.step("Left")
    assert env.anchor() == start == "SFFF/FHFH/FFFH/HFFG@0,0"


def test_examples_are_oracle_moves_on_fixed_maps():
    ex = FrozenLake().examples()
    assert [resp for _, resp in ex] == ["Down", "Right"]
    assert all(obs.count("\n") == 4 and "Goal:" not in obs for obs, _ in ex)
    assert FrozenLake().examples() == FrozenLake(map_name="8x8").examples()


@pytest.mark.parametrize("kwargs", [{"map_name": "8x8", "max_turns": 20}, {"size": 5, "max_actions_per_turn": 2}])
def test_check_env_variants(kwargs):
    check_env("frozenlake-v0", random_tasks=kwargs.get("map_name") != "8x8", **kwargs)


def test_check_env_slippery():
    check_env("frozenlake-v0", slippery=True, check_solve=False, random_tasks=True)


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="map_name"):
        FrozenLake(map_name="5x5")
    with pytest.raises(ValueError, match="exactly one S"):
        FrozenLake(desc=["FFF", "FFG"])
    with pytest.raises(ValueError, match="equally long"):
        FrozenLake(desc=["SF", "FFG"])
    with pytest.raises(ValueError, match="p_frozen"):
        FrozenLake(p_frozen=0.0)



def test_task_key_is_the_layout_so_seeds_drawing_the_same_map_are_one_task():
    env = make("frozenlake-v0")
    keys, maps = {}, {}
    for seed in (2, 28, 7):  # seeds 2 and 28 draw the same 4x4 map; 7 another
        env.reset(seed=seed)
        keys[seed], maps[seed] = env.task_key(), list(env.unwrapped.desc)
    assert maps[2] == maps[28] != maps[7]
    assert keys[2] == keys[28] == "/".join(maps[2]) and keys[7] != keys[2]
    env.reset(seed=2)
    env.step("Right")
    assert env.task_key() == keys[2] and env.anchor() != keys[2]  # the key stays; the anchor follows the player
    hackable = make("frozenlake-hackable-v0")
    hackable.reset(seed=28)
    assert hackable.task_key() == keys[2]
