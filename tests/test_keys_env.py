"""keys-v0 (turnrl.envs.keys): the contract, determinism per seed, the oracle, task keys, and a code seen only once."""

import sys
from pathlib import Path

import pytest

from turnrl.envs import check_env, make
from turnrl.envs.keys import COLOURS, KeysAndDoors

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from baselines import Cap, policies_for, run_policy  # noqa: E402

from turnrl.build import Task  # noqa: E402


def test_keys_env_passes_check_env():
    check_env("keys-v0", seeds=(0, 1, 2, 3), random_tasks=True)


def test_the_same_seed_gives_the_same_task_and_the_oracle_succeeds_seeing_the_code_once():
    for seed in range(20):
        env, twin = make("keys-v0"), make("keys-v0")
        first, _ = env.reset(seed=seed)
        assert twin.reset(seed=seed)[0] == first and twin.task_key() == env.task_key() and twin.solve() == env.solve()
        code = env.unwrapped.code
        assert f"code colour is {code}." in first
        plan = env.solve()
        assert len(plan) == 7 and plan[-1] == code
        for action in plan:
            obs, reward, terminated, truncated, info = env.step(f"I choose {action}.")
            assert info["valid"] and (code not in obs.split() or terminated)  # never shown again before the end
        assert terminated and info["success"] and reward == 1.0 and not truncated


def test_a_wrong_colour_fails_a_blocked_passage_keeps_the_room_and_text_without_an_action_is_invalid():
    env = KeysAndDoors(rooms=2)
    env.reset(seed=3)
    open_, blocked = env.open[0], "Left" if env.open[0] == "Right" else "Right"
    obs, reward, terminated, _, info = env.step(blocked)
    assert obs.startswith("That passage is blocked") and env.room == 0 and info["valid"] and not terminated
    obs, _, _, _, info = env.step("the blue one")  # a colour is no move in a room
    assert not info["valid"] and obs.startswith("Invalid action. Answer Left or Right.")
    env.step(open_)
    env.step(env.open[1])
    wrong = next(c for c in COLOURS if c != env.code)
    obs, reward, terminated, _, info = env.step(wrong)
    assert terminated and not info["success"] and reward == 0.0 and env.code in obs


def test_the_example_note_is_what_the_examples_show_first_and_answer_last():
    env = KeysAndDoors()
    (first, _), *_, (door, code) = env.examples()
    assert f"code colour is {code}." in first and "vault door" in door and env.example_note() == f"code {code}"


def test_task_keys_separate_tasks_by_code_and_passages():
    keys = {}
    for seed in range(300):
        env = KeysAndDoors()
        env.reset(seed=seed)
        keys.setdefault(env.task_key(), set()).add((env.code, tuple(env.open)))
    assert len(keys) > 150  # distinct tasks: 6 colours x 64 layouts
    assert all(len(tasks) == 1 for tasks in keys.values())  # one key, one task


def test_baselines_have_a_rule_and_an_oracle_for_it():
    factory = lambda: make("keys-v0", max_turns=12)  # noqa: E731
    tasks = [Task(seed, None) for seed in range(30)]
    policies = policies_for(factory())
    success = {name: sum(g.trajectories[0].success for g in run_policy(factory, tasks, policies[name], Cap(), "keys-v0"))
               for name in ("random", "rule", "oracle")}
    codes = []
    for t in tasks:
        env = KeysAndDoors()
        env.reset(seed=t.seed)
        codes.append(env.code)
    red = codes.count("red")
    assert success["oracle"] == 30 and success["random"] < 30
    assert 0 < red < 30 and success["rule"] == red  # it always reaches the door; its fixed guess is right for red only


@pytest.mark.parametrize("rooms", [0, 65])
def test_rooms_outside_one_to_sixty_four_are_refused_with_the_range(rooms):
    with pytest.raises(ValueError, match="between 1 and 64"):
        KeysAndDoors(rooms=rooms)


def test_a_sixty_four_room_walk_is_solved_by_the_plan():
    env = KeysAndDoors(rooms=64)
    env.reset(seed=5)
    plan = env.solve()
    for action in plan:
        obs, reward, terminated, _, info = env.step(action)
    assert len(plan) == 65 and terminated and info["success"] and reward == 1.0
