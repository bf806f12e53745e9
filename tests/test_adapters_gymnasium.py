"""Gymnasium toy-text adapter (turnrl.envs.adapters.gymnasium) against the real gymnasium package."""

import gymnasium as gym
import pytest

from turnrl.envs import check_env, make
from turnrl.envs.adapters.gymnasium import GymToyText


@pytest.mark.parametrize(
    ("env_id", "kwargs", "check_solve", "random_tasks"),
    [
        ("gym-frozenlake-v0", {}, True, True),  # a random 4x4 map per seed
        ("gym-frozenlake-v0", {"random_map": None}, True, False),  # Gymnasium's fixed 4x4 map for every seed
        ("gym-frozenlake-v0", {"random_map": 5}, True, True),
        ("gym-taxi-v0", {}, True, True),
        ("gym-cliffwalking-v0", {}, True, False),
        ("gym-blackjack-v0", {}, False, True),  # no oracle: a card game
        ("gym-frozenlake-v0", {"is_slippery": True}, False, True),  # stochastic: solve() is not implemented
    ],
)
def test_registered_gym_envs_pass_check_env(env_id, kwargs, check_solve, random_tasks):
    check_env(env_id, seeds=(0, 1, 2, 3), check_solve=check_solve, random_tasks=random_tasks, **kwargs)


@pytest.mark.parametrize(("env_id", "plan_length", "final_reward", "total"), [
    ("gym-taxi-v0", None, 20.0, None),
    ("gym-cliffwalking-v0", 13, -1.0, -13.0),
    ("gym-frozenlake-v0", None, 1.0, 1.0),
])
def test_following_the_oracle_succeeds_with_gymnasiums_rewards(env_id, plan_length, final_reward, total):
    env = make(env_id)
    env.reset(seed=4)
    plan = env.solve()
    if plan_length is not None:
        assert len(plan) == plan_length
    rewards = []
    for action in plan:
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        assert info["reward_components"] == {"env": reward}
    assert terminated and not truncated and info["success"]
    assert rewards[-1] == final_reward
    if total is not None:
        assert sum(rewards) == total
    if env_id == "gym-taxi-v0":  # every move costs -1, the delivery pays +20
        assert rewards[:-1] == [-1.0] * (len(plan) - 1)
    assert info["episode"]["success"] is True


def test_matches_raw_gymnasium_for_the_same_seed_and_actions():
    ours = GymToyText("blackjack")
    raw = gym.make("Blackjack-v1")
    for seed in range(20):
        ours.reset(seed=seed)
        obs, _ = raw.reset(seed=seed)
        assert ours.anchor() == f"blackjack:{obs!r}"
        for word, index in (("hit", 1), ("stand", 0)):  # "stand" is an alias of Stick
            _, reward, terminated, _, info = ours.step(f"I will {word}.")
            obs, raw_reward, raw_terminated, _, _ = raw.step(index)
            assert (reward, terminated) == (float(raw_reward), raw_terminated)
            assert info["success"] == (raw_terminated and raw_reward > 0)
            if terminated:
                break


def test_actions_by_name_and_alias_and_invalid_text_does_not_step():
    env = GymToyText("taxi")
    env.reset(seed=0)
    row, col, _, _ = env._env.unwrapped.decode(int(env._obs))
    assert row < 4, "the test needs a taxi that can move south"
    before = env.anchor()
    obs, reward, terminated, _, info = env.step("drive diagonally")
    assert not info["valid"] and info["actions"] == [] and reward == 0.0 and not terminated
    assert env.anchor() == before and obs.startswith("Invalid action. Answer with one of: South, North, East, West")
    _, reward, _, _, info = env.step("<answer>down</answer>")  # screen alias of South
    assert info["actions"] == ["South"] and reward == -1.0
    assert f"Taxi T at row {row + 1}, column {col}" in env.render()
    _, _, _, _, info = env.step("Pick up")  # two-word alias
    assert info["actions"] == ["Pickup"]


def test_cliff_costs_100_and_returns_to_start_without_terminating():
    env = make("gym-cliffwalking-v0")
    obs, _ = env.reset(seed=0)
    assert obs.splitlines()[-1].startswith("P C C")
    obs, reward, terminated, _, info = env.step("Right")
    assert reward == -100.0 and not terminated and not info["success"]
    assert "back at the start" in obs and obs.splitlines()[3].startswith("P C C")


def test_gymnasium_time_limit_is_a_truncation():
    env = make("gym-frozenlake-v0", max_turns=500)  # turnrl's limit above Gymnasium's 100 steps
    env.reset(seed=0)
    for turn in range(1, 101):
        _, _, terminated, truncated, info = env.step("Left")  # into the wall: stays at the start
        if truncated:
            break
    assert turn == 100 and not terminated and info["truncation"] == "gym_time_limit"


def test_random_maps_follow_the_seed_and_slippery_has_no_oracle():
    env = GymToyText("frozenlake", random_map=6, is_slippery=False)
    maps = {seed: env.reset(seed=seed)[0] for seed in range(4)}
    assert maps[2] == env.reset(seed=2)[0] and len(set(maps.values())) > 1
    assert len(maps[0].splitlines()) == 6
    slippery = GymToyText("frozenlake", is_slippery=True)
    slippery.reset(seed=0)
    with pytest.raises(NotImplementedError, match="no deterministic oracle"):
        slippery.solve()
    with pytest.raises(ValueError, match="choose one of"):
        GymToyText("pong")
    with pytest.raises(ValueError, match="pass random_map=None"):
        make("gym-frozenlake-v0", map_name="8x8")
    assert len(make("gym-frozenlake-v0", random_map=None, map_name="8x8").reset(seed=0)[0].splitlines()) == 8


def test_task_keys_follow_the_map_and_the_dealt_cards():
    lake = make("gym-frozenlake-v0")
    keys = {}
    for seed in (2, 3, 8):  # seeds 2 and 3 draw the same random map, 8 another
        lake.reset(seed=seed)
        keys[seed] = lake.task_key()
    assert keys[2] == keys[3] != keys[8]
    lake.reset(seed=2)
    lake.step(lake.solve()[0])
    assert lake.task_key() == keys[2]
    blackjack = make("gym-blackjack-v0")
    blackjack.reset(seed=0)
    dealer = blackjack.unwrapped._env.unwrapped.dealer
    assert blackjack.task_key().endswith(f":{dealer}") and len(dealer) == 2  # the hidden card is part of the hand
