"""Sokoban: pushing rules, solvable seeded puzzles, oracle, parsing, check_env."""

import pytest

from turnrl.envs import check_env, make
from turnrl.envs.sokoban import Puzzle, Sokoban, solve


def test_push_rules():
    p = Puzzle.parse(["######", "#P X_#", "#_XX_#", "#___O#", "######"])
    p.walls.discard((1, 2))
    assert p.push("Up") == (p.player, p.boxes)  # wall
    p2 = Puzzle.parse(["#####", "#PX_#", "#_XO#", "#__O#", "#####"])
    player, boxes = p2.push("Right")
    assert player == (1, 2) and (1, 3) in boxes  # box pushed onto free floor
    p3 = Puzzle.parse(["#####", "#PX##", "#___#", "#__O#", "#####"])
    assert p3.push("Right") == (p3.player, p3.boxes)  # box against a wall does not move
    p4 = Puzzle.parse(["######", "#PXX_#", "#____#", "#_OO_#", "######"])
    assert p4.push("Right") == (p4.player, p4.boxes)  # two boxes in a row do not move


def test_render_roundtrip_and_symbols():
    rows = ["#####", "#S_X#", "#_√_#", "#__O#", "#####"]
    assert Puzzle.parse(rows).render() == "\n".join(rows)


@pytest.mark.parametrize("seed", range(20))
def test_seeded_puzzles_are_solvable_and_the_oracle_solves_them(seed):
    env = make("sokoban-v0", max_turns=60)
    obs, _ = env.reset(seed=seed)
    plan = env.solve()
    assert plan and not env.unwrapped.puzzle.solved
    for a in plan:
        _, r, term, trunc, info = env.step(a)
    assert term and info["success"] and r == 1.0


def test_two_box_puzzles():
    env = Sokoban(size=7, num_boxes=2)
    env.reset(seed=3)
    assert len(env.puzzle.boxes) == 2 and solve(env.puzzle) is not None


def test_same_seed_same_puzzle_different_seeds_differ():
    assert Sokoban().reset(seed=4) == Sokoban().reset(seed=4)
    assert len({Sokoban().reset(seed=s)[0] for s in range(10)}) > 5


def test_invalid_text_gets_feedback():
    env = Sokoban()
    obs0, _ = env.reset(seed=0)
    obs, r, term, trunc, info = env.step("push it real good")
    assert "Invalid action" in obs and obs0 in obs and not info["valid"] and r == 0.0


def test_examples_and_anchor():
    env = Sokoban()
    env.reset(seed=1)
    assert env.anchor() == env.render()
    assert [a for _, a in env.examples()] == solve(Puzzle.parse(["#####", "#P__#", "#_X_#", "#__O#", "#####"]))[:2]


def test_check_env():
    check_env("sokoban-v0")
    check_env("sokoban-v0", num_boxes=2, size=7, max_turns=40)
