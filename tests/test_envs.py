"""Registry, wrappers, check_env and play, on the built-in envs."""

import pytest

from turnrl.envs import EnvCheckError, UnknownEnvError, check_env, make, register, registered
from turnrl.envs.base import Env
from turnrl.envs.wrappers import OracleProgress, TurnLimit
from turnrl.play import play


def test_registry_lists_builtins_and_unknown_ids_suggest():
    assert {"frozenlake-v0", "sokoban-v0"} <= set(registered())
    with pytest.raises(UnknownEnvError, match="Did you mean 'frozenlake-v0'"):
        make("frozenlak-v0")


def test_duplicate_and_malformed_ids_are_errors():
    with pytest.raises(ValueError, match="already registered"):
        register("frozenlake-v0", "turnrl.envs.frozenlake:FrozenLake")
    with pytest.raises(ValueError, match="name-v0"):
        register("FrozenLake", "turnrl.envs.frozenlake:FrozenLake")


def test_turn_limit_truncates_and_never_terminates():
    env = make("frozenlake-v0", max_turns=2, map_name="4x4")
    env.reset(seed=0)
    _, _, term, trunc, _ = env.step("Up")
    assert not term and not trunc
    _, _, term, trunc, info = env.step("Up")
    assert not term and trunc and info["truncation"] == "turns"
    assert info["episode"] == {"return": 0.0, "length": 2, "invalid": 0, "success": False}


def test_termination_on_the_last_allowed_turn_is_not_truncation():
    env = make("frozenlake-v0", max_turns=2, map_name="4x4")
    env.reset(seed=0)
    env.step("Right")
    _, _, term, trunc, info = env.step("Down")  # hole at (1,1)
    assert term and not trunc and "truncation" not in info


def test_progress_shaping_components():
    env = make("frozenlake-v0", map_name="4x4", progress_reward=0.5)
    env.reset(seed=0)
    _, r, *_ , info = env.step("Down")  # shortest plan 6 -> 5
    assert r == 0.5 and info["reward_components"] == {"outcome": 0.0, "progress": 0.5}
    _, r, *_ , info = env.step("Up")  # back: 5 -> 6
    assert r == -0.5
    _, r, *_ , info = env.step("Up")  # wall: no change
    assert r == 0.0
    env.step("Right")
    _, r, term, _, info = env.step("Down")  # into the hole at (1,1): counts as one step away
    assert term and r == -0.5


def test_progress_shaping_needs_an_oracle():
    class NoOracle(Env):
        def reset(self, *, seed=None, options=None):
            return "x", {}

    with pytest.raises(TypeError, match="progress_reward=0"):
        OracleProgress(NoOracle(), 0.1).reset(seed=0)


def test_check_env_catches_broken_envs():
    class Broken(Env):
        def reset(self, *, seed=None, options=None):
            import random
            return f"state {random.random()}", {}  # ignores the seed

        def step(self, action_text):
            return "x", 1.0, False, False, {"actions": [], "valid": False, "success": False, "reward_components": {}}

        def anchor(self):
            return "a"

    with pytest.raises(EnvCheckError, match="different observations"):
        check_env(TurnLimit(Broken(), 3))


def test_play_scripted_session():
    inputs = iter(["?", "Down", "nonsense", "q"])
    out = []
    summary = play("frozenlake-v0", seed=0, map_name="4x4", input_fn=lambda _: next(inputs), print_fn=lambda *a: out.append(" ".join(map(str, a))))
    text = "\n".join(out)
    assert "oracle: Down" in text and "Invalid action" in text
    assert summary["turns"] == 2 and not summary["success"] and summary["termination"] == "quit"
