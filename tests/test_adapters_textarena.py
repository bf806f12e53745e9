"""TextArena adapter (turnrl.envs.adapters.textarena) against the real textarena package."""

import random
import sys

import pytest

from turnrl.envs import check_env, make, registered
from turnrl.envs.adapters import MissingExtraError
from turnrl.envs.adapters.textarena import TextArena

# Single-player games that need no download; True where seeds draw different tasks (task keys: a scrambled board,
# or a hidden number or code), False where they do not (mines placed on the first reveal, a fixed tower or
# Countdown's registered numbers).
OFFLINE_GAMES = {"GuessTheNumber-v0": True, "TowerOfHanoi-v0": False, "Minesweeper-v0-small": False,
                 "Mastermind-v0": True, "LightsOut-v0": True, "FifteenPuzzle-v0": True, "Sudoku-v0-very-easy": True,
                 "Countdown-v0": False, "GuessTheNumber-v0-raw": True, "TowerOfHanoi-v0-train": False}


@pytest.mark.parametrize(("game", "random_tasks"), OFFLINE_GAMES.items())
def test_games_pass_check_env(game, random_tasks):
    # No oracle: check_env plays garbage text (invalid twice in a row ends a TextArena game).
    check_env("textarena-v0", game=game, seeds=(0, 1, 2, 3), random_tasks=random_tasks)


def test_guess_the_number_by_binary_search_wins():
    env = make("textarena-v0", game="GuessTheNumber-v0")
    obs, _ = env.reset(seed=4)
    assert "between 1 and 20" in obs
    low, high = 1, 20
    for _ in range(10):
        guess = (low + high) // 2
        obs, reward, terminated, _, info = env.step(f"My guess is [{guess}]")
        assert info["valid"] and info["actions"] == [f"[{guess}]"]
        if terminated:
            break
        assert reward == 0.0
        if obs.splitlines()[-1].endswith("higher."):
            low = guess + 1
        else:
            high = guess - 1
    assert terminated and reward == 1.0 and info["success"] and info["reward_components"] == {"outcome": 1.0}
    assert "Game over: Congratulations" in obs


def test_tower_of_hanoi_solution_wins():
    env = make("textarena-v0", game="TowerOfHanoi-v0")
    env.reset(seed=0)
    for move in ["A C", "A B", "C B", "A C", "B A", "B C", "A C"]:
        _, reward, terminated, _, info = env.step(f"[{move}]")
    assert terminated and reward == 1.0 and info["success"]


def test_invalid_moves_follow_textarenas_error_allowance():
    env = make("textarena-v0", game="GuessTheNumber-v0")
    env.reset(seed=1)
    anchor = env.anchor()
    obs, reward, terminated, _, info = env.step("no brackets here")
    assert not info["valid"] and info["actions"] == [] and not terminated and env.anchor() == anchor
    assert "invalid move" in obs
    _, reward, terminated, _, info = env.step("still nothing")  # the second in a row ends the game
    assert terminated and not info["valid"] and not info["success"] and reward == 0.0  # GuessTheNumber's penalty: 0
    assert "Invalid Move" in info["reason"]

    lenient = make("textarena-v0", game="GuessTheNumber-v0", error_allowance=3)
    lenient.reset(seed=1)
    for _ in range(3):
        _, _, terminated, _, info = lenient.step("nothing")
        assert not terminated and not info["valid"]


def test_a_games_non_numeric_final_reward_becomes_zero():
    env = make("textarena-v0", game="Countdown-v0")
    env.reset(seed=0)
    env.step("no move")
    _, reward, terminated, _, info = env.step("no move again")  # ends the game; Countdown's reward is a string
    assert terminated and reward == 0.0 and not info["valid"] and "Invalid action format" in info["textarena_reward"]


def _minesweeper_episode(env, seed, between=lambda: None):
    """Reset with ``seed`` and reveal cells; ``between`` runs before every call (other envs, global RNG use)."""
    between()
    trace = [env.reset(seed=seed)[0]]
    for cell in ["[2 2]", "[0 0]", "[4 4]", "[0 4]"]:  # mines are placed with the global RNG on the first reveal
        between()
        obs, reward, terminated, truncated, info = env.step(cell)
        trace.append((obs, reward, terminated, info["valid"], info["success"], env.anchor()))
        if terminated:
            break
    return trace


def test_episode_is_unchanged_by_other_envs_and_global_rng_use_in_between():
    alone = _minesweeper_episode(TextArena("Minesweeper-v0-small"), seed=7)
    other = TextArena("Minesweeper-v0-small")
    other.reset(seed=99)
    moves = iter(f"[{r} {c}]" for r in range(5) for c in range(5))

    def meddle():
        random.seed(12345)
        random.random()
        other.step(next(moves)) if not other._done else other.reset(seed=98)

    assert _minesweeper_episode(TextArena("Minesweeper-v0-small"), seed=7, between=meddle) == alone


def test_the_callers_global_rng_is_left_alone():
    env = TextArena("Minesweeper-v0-small")
    random.seed(2024)
    expected = [random.random() for _ in range(3)]
    random.seed(2024)
    env.reset(seed=5)  # TextArena calls random.seed(5) inside
    env.step("[2 2]")  # and draws the mines from the global RNG
    assert [random.random() for _ in range(3)] == expected


def test_unseeded_reset_continues_the_envs_own_stream():
    a, b = TextArena("Mastermind-v0"), TextArena("Mastermind-v0")
    a.reset(seed=3)
    b.reset(seed=3)
    random.seed(0)  # global RNG use between resets must not matter
    assert [a.reset()[0] for _ in range(3)] == [b.reset()[0] for _ in range(3)]
    assert a.anchor() == b.anchor()


def test_multi_player_games_and_unknown_names_are_rejected():
    with pytest.raises(ValueError, match="not a single-player game"):
        TextArena("Nim-v0").reset(seed=0)  # asserts two players
    with pytest.raises(ValueError, match="its state is a TwoPlayerState"):
        TextArena("QuantumTicTacToe-v0").reset(seed=0)  # accepts one player without complaint
    with pytest.raises(ValueError, match="Did you mean 'GuessTheNumber-v0'"):
        TextArena("GuessTheNumbr-v0")


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # import textarena now fails like an absent package
    assert "textarena-v0" in registered()  # listing ids imports nothing
    with pytest.raises(MissingExtraError, match=r"pip install 'turnrl\[envs\]'"):
        make("textarena-v0")


def test_task_key_tells_apart_games_that_differ_only_in_their_secret():
    env = make("textarena-v0", game="GuessTheNumber-v0")
    observations, keys = set(), set()
    for seed in range(4):
        obs, _ = env.reset(seed=seed)
        observations.add(obs)
        keys.add(env.task_key())
    assert len(observations) == 1 and len(keys) == 4  # the same first message, four secret numbers
    env.reset(seed=2)
    key = env.task_key()
    env.step("[50]")
    assert env.task_key() == key
    other = make("textarena-v0", game="GuessTheNumber-v0")
    other.reset(seed=2)
    assert other.task_key() == key
