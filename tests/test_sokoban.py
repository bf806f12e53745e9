"""Sokoban: pushing rules, corner deadlocks, solvable seeded puzzles, oracle, parsing, check_env."""

import pytest

from turnrl.envs import check_env, make
from turnrl.envs.sokoban import Puzzle, Sokoban, solve


def test_push_rules():
    p = Puzzle.parse(["#####", "#PX_#", "#_XO#", "#__O#", "#####"])
    assert p.moved("Up") == p  # wall
    q = p.moved("Right")
    assert q.player == (1, 2) and q.boxes == {(1, 3), (2, 2)}  # a box pushed onto free floor
    assert q.moved("Right") == q  # a box against a wall does not move
    r = p.moved("Down").moved("Right")
    assert r.player == (2, 2) and r.boxes == {(1, 2), (2, 3)} and not r.solved  # pushed onto a target
    two = Puzzle.parse(["######", "#PXX_#", "#____#", "#_OO_#", "######"])
    assert two.moved("Right") == two  # two boxes in a row do not move


def test_render_roundtrip_and_symbols():
    rows = ["#####", "#S_X#", "#_*_#", "#__O#", "#####"]
    p = Puzzle.parse(rows)
    assert p.render() == "\n".join(" ".join(row) for row in rows)
    assert Puzzle.parse(p.render().splitlines()) == p
    assert p.targets == {(1, 1), (2, 2), (3, 3)} and p.boxes == {(1, 3), (2, 2)}
    with pytest.raises(ValueError, match="exactly one P"):
        Puzzle.parse(["###", "#X#", "###"])


@pytest.mark.parametrize("seed", range(20))
def test_seeded_puzzles_are_solvable_and_the_oracle_solves_them(seed):
    env = make("sokoban-v0")
    obs, info = env.reset(seed=seed)
    plan = env.solve()
    assert not env.unwrapped.puzzle.solved and plan and len(plan) == info["optimal_length"]  # two searches agree
    assert 4 <= len(plan) <= 10
    for i, a in enumerate(plan):
        _, r, term, trunc, info = env.step(a)
        assert term == (i == len(plan) - 1) and not trunc
    assert info["success"] and r == 1.0 and info["reward_components"] == {"outcome": 1.0}


def test_multi_box_puzzles_and_difficulty_range():
    env = Sokoban(size=7, num_boxes=2, min_solution=8, max_solution=12)
    for seed in range(3):
        _, info = env.reset(seed=seed)
        assert len(env.puzzle.boxes) == 2 and 8 <= len(solve(env.puzzle)) == info["optimal_length"] <= 12
    with pytest.raises(RuntimeError, match="smaller min_solution"):
        Sokoban(size=5, min_solution=40, max_solution=40).reset(seed=0)


def test_a_box_in_a_corner_is_a_deadlock():
    env = Sokoban()
    env.puzzle = Puzzle.parse(["#####", "#__O#", "#_X_#", "#__P#", "#####"])
    env.step("Left")
    _, _, term, _, info = env.step("Up")
    assert env.puzzle.boxes == {(1, 2)} and not term and not info["deadlock"]  # against a wall, not in a corner
    env.step("Right")
    env.step("Up")
    obs, r, term, trunc, info = env.step("Left")
    assert env.puzzle.boxes == {(1, 1)}
    assert term and not trunc and not info["success"] and info["deadlock"] and r == 0.0
    assert obs.endswith("Deadlock: a box is stuck in a corner.") and env.solve() is None
    corner_target = Puzzle.parse(["####", "#*P#", "####"])
    assert not corner_target.deadlocked and corner_target.solved


def test_same_seed_same_puzzle_different_seeds_differ():
    assert Sokoban().reset(seed=4) == Sokoban().reset(seed=4)
    assert len({Sokoban().reset(seed=s)[0] for s in range(10)}) > 5


def test_invalid_text_gets_feedback_and_parsing_is_free_text():
    env = Sokoban()
    obs0, _ = env.reset(seed=0)
    obs, r, term, trunc, info = env.step("push it real good")
    assert obs == "Invalid action. Answer with one of: Up, Down, Left, Right.\n" + obs0
    assert not info["valid"] and r == 0.0 and not term and env.render() == obs0
    plan = env.solve()
    _, _, _, _, info = env.step(f"I will go <answer>{plan[0].lower()}.</answer>")
    assert info["valid"] and info["actions"] == [plan[0]]


def test_several_actions_per_turn_stop_when_solved():
    env = Sokoban(max_actions_per_turn=20)
    env.reset(seed=2)
    plan = env.solve()
    _, r, term, _, info = env.step(" ".join(plan + ["Up", "Down"]))
    assert term and r == 1.0 and info["actions"] == plan


def test_examples_and_anchor():
    env = Sokoban()
    env.reset(seed=1)
    assert env.anchor() == env.render()
    ex = env.examples()
    assert [a for _, a in ex] == ["Down", "Up"]
    assert [solve(Puzzle.parse(obs.splitlines()))[0] for obs, _ in ex] == ["Down", "Up"]


def test_hint_line_names_the_neighbours_and_where_the_box_and_its_target_are():
    p = Puzzle.parse(["#####", "#_XP#", "#__X#", "#O_O#", "#####"])
    # Left: a box with floor behind it; Down: a box with a target behind it; the nearer box (a tie: the upper one) is
    # 1 left, and its nearest free target (a tie: the left one) 2 down 1 left of it
    assert p.hint() == "Up: wall, Down: box (push), Left: box (push), Right: wall; box 1 left; its target 2 down 1 left of it"
    stuck = Puzzle.parse(["#####", "#XP_#", "#__O#", "#####"])
    assert stuck.hint().startswith("Up: wall, Down: floor, Left: box (stuck), Right: floor; box 1 left; its target 1 down 2 right")
    assert Puzzle.parse(["####", "#S*#", "####"]).hint() == "Up: wall, Down: wall, Left: wall, Right: box (stuck)"  # solved

    env = Sokoban(size=5, show_hints=True)
    obs, _ = env.reset(seed=3)
    grid, hint = obs.rsplit("\n", 1)
    assert hint == env.situation() == env.puzzle.hint() and Puzzle.parse(grid.splitlines()) == env.puzzle
    assert all(o.endswith(Puzzle.parse(o.splitlines()[:-1]).hint()) for o, _ in env.examples())
    assert make("sokoban-v0", size=5).reset(seed=3)[0] == grid  # off by default: the grid alone
    check_env("sokoban-v0", show_hints=True, random_tasks=True)


def test_check_env():
    check_env("sokoban-v0", random_tasks=True)
    check_env("sokoban-v0", num_boxes=2, size=7, max_turns=40, random_tasks=True)


def test_task_key_is_the_starting_puzzle():
    env = make("sokoban-v0")
    first, _ = env.reset(seed=3)
    key = env.task_key()
    assert key == first.replace(" ", "").replace("\n", "/")
    env.step(env.solve()[0])
    assert env.task_key() == key and env.anchor() != first  # a move changes the state, not the task
    other = make("sokoban-v0")
    other.reset(seed=3)
    assert other.task_key() == key
    assert len({(env.reset(seed=s), env.task_key())[1] for s in range(10)}) == 10
