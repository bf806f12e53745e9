"""Registry, wrappers, check_env and play, on the built-in envs and small stand-ins."""

import asyncio
import threading
import time

import pytest

from turnrl.envs import (
    EnvCheckError, EnvLoadError, EpisodeStatistics, InvalidActionPenalty, OracleProgress, TurnLimit, UnknownEnvError,
    check_env, make, register, registered, registry,
)
from turnrl.envs.base import Env
from turnrl.envs.play import play


class Counter(Env):
    """Say 'up' until the counter reaches ``goal``; anything else is invalid. Deterministic and seed-free."""

    instructions = "Say up."

    def __init__(self, goal: int = 3) -> None:
        self.goal = goal
        self.n = 0

    def reset(self, *, seed=None, options=None):
        self.n = 0
        return "counter 0", {}

    def step(self, action_text):
        valid = action_text.strip().lower() == "up"
        self.n += valid
        done = self.n >= self.goal
        info = {"actions": ["up"] if valid else [], "valid": valid, "success": done, "reward_components": {"outcome": float(done)}}
        return f"counter {self.n}", float(done), done, False, info

    def anchor(self):
        return str(self.n)

    def solve(self):
        return ["up"] * (self.goal - self.n)


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made in a test do not outlive it."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


# ---- registry ----------------------------------------------------------------------------------------------

def test_builtins_are_registered_with_one_line_descriptions():
    envs = registered()
    assert {"frozenlake-v0", "sokoban-v0"} <= set(envs)
    assert all(desc and "\n" not in desc for desc in envs.values())


def test_unknown_id_names_the_closest_and_lists_all():
    with pytest.raises(UnknownEnvError) as err:
        make("frozenlak-v0")
    assert isinstance(err.value, KeyError)
    assert "Did you mean 'frozenlake-v0'" in str(err.value) and "frozenlake-v0" in str(err.value) and "sokoban-v0" in str(err.value)
    assert "register(" in str(err.value) and "'package.module:Class'" in str(err.value)


def test_a_module_class_id_builds_that_class_without_registration(tmp_path, monkeypatch):
    (tmp_path / "my_guess_env.py").write_text(
        "from turnrl.envs import Env\n\n"
        "class Guess(Env):\n"
        "    def __init__(self, secret=3):\n"
        "        self.secret = secret\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        return 'guess', {}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make("my_guess_env:Guess", secret=5, max_turns=3)
    assert type(env.unwrapped).__name__ == "Guess" and env.unwrapped.secret == 5 and env.max_turns == 3
    assert "my_guess_env:Guess" not in registered()
    assert make("turnrl.envs.frozenlake:FrozenLake").max_turns == 16  # unregistered: the default turn limit
    with pytest.raises(EnvLoadError, match="module 'my_guess_env' has no 'Gues'. Env classes there: Guess"):
        make("my_guess_env:Gues")
    with pytest.raises(EnvLoadError, match="no module named 'nowhere_module'.*PYTHONPATH=.*or install it"):
        make("nowhere_module:Guess")
    with pytest.raises(TypeError, match="no argument 'secrte'. Did you mean 'secret'"):
        make("my_guess_env:Guess", secrte=1)


def test_duplicate_and_malformed_registrations_are_errors(scratch_registry):
    with pytest.raises(ValueError, match="already registered.*'frozenlake-v1'"):
        register("frozenlake-v0", "turnrl.envs.frozenlake:FrozenLake")
    for bad_id in ("FrozenLake", "frozenlake", "frozen lake-v0", "frozenlake-v"):
        with pytest.raises(ValueError, match="name-v0"):
            register(bad_id, "turnrl.envs.frozenlake:FrozenLake")
    with pytest.raises(ValueError, match="package.module:Class"):
        register("frozenlake-v9", "turnrl.envs.frozenlake.FrozenLake")


def test_entry_points_are_lazy_and_defaults_merge(scratch_registry):
    register("missing-v0", "turnrl_no_such_package.module:Env")  # not imported until make
    with pytest.raises(EnvLoadError, match="no module named 'turnrl_no_such_package'.*PYTHONPATH"):
        make("missing-v0")
    register("counter-v0", Counter, description="count", goal=2, max_turns=5)
    env = make("counter-v0")
    assert env.unwrapped.goal == 2 and env.max_turns == 5  # attribute lookups fall through the wrappers
    assert make("counter-v0", goal=4, max_turns=9).unwrapped.goal == 4
    assert make("frozenlake-v0").max_turns == 8 and make("sokoban-v0").max_turns == 20


def test_unknown_kwargs_name_the_kwarg_and_the_valid_ones():
    with pytest.raises(TypeError, match="no argument 'slipery'. Did you mean 'slippery'.*Valid arguments: map_name"):
        make("frozenlake-v0", slipery=True)
    with pytest.raises(TypeError, match="'colour'.*max_turns, invalid_penalty"):
        make("sokoban-v0", colour="red")


# ---- wrappers -------------------------------------------------------------------------------------------------

def test_turn_limit_truncates_and_never_terminates():
    env = make("frozenlake-v0", max_turns=2, map_name="4x4")
    env.reset(seed=0)
    _, _, term, trunc, info = env.step("Up")
    assert not term and not trunc and "episode" not in info
    _, _, term, trunc, info = env.step("Up")
    assert not term and trunc and info["truncation"] == "turns"
    assert info["episode"] == {"return": 0.0, "length": 2, "invalid": 0, "success": False}


def test_termination_on_the_last_allowed_turn_is_not_truncation():
    env = make("frozenlake-v0", max_turns=2, map_name="4x4")
    env.reset(seed=0)
    env.step("Right")
    _, _, term, trunc, info = env.step("Down")  # the hole at (1, 1)
    assert term and not trunc and "truncation" not in info


def test_turn_limit_resets_its_count():
    env = TurnLimit(Counter(goal=10), max_turns=2)
    for _ in range(2):
        env.reset(seed=0)
        assert not env.step("up")[3] and env.step("up")[3]


def test_invalid_penalty_is_its_own_component_and_stats_count_it():
    env = EpisodeStatistics(TurnLimit(InvalidActionPenalty(Counter(goal=1), 0.25), max_turns=5))
    env.reset(seed=0)
    _, r, _, _, info = env.step("down")
    assert r == -0.25 and info["reward_components"] == {"outcome": 0.0, "invalid_penalty": -0.25} and not info["valid"]
    _, r, term, _, info = env.step("up")
    assert r == 1.0 and term and info["reward_components"] == {"outcome": 1.0}
    assert info["episode"] == {"return": 0.75, "length": 2, "invalid": 1, "success": True}
    with pytest.raises(ValueError, match="penalty"):
        InvalidActionPenalty(Counter(), -1.0)


def test_progress_shaping_components():
    env = make("frozenlake-v0", map_name="4x4", progress_reward=0.5)
    env.reset(seed=0)
    _, r, *_, info = env.step("Down")  # shortest plan 6 -> 5
    assert r == 0.5 and info["reward_components"] == {"outcome": 0.0, "progress": 0.5}
    _, r, *_ = env.step("Up")  # back: 5 -> 6
    assert r == -0.5
    _, r, *_ = env.step("Up")  # the wall: no change
    assert r == 0.0
    env.step("Right")
    _, r, term, _, _ = env.step("Down")  # into the hole at (1, 1): counts as one step away
    assert term and r == -0.5


def test_progress_shaping_needs_an_oracle():
    class NoOracle(Env):
        def reset(self, *, seed=None, options=None):
            return "x", {}

    with pytest.raises(TypeError, match="progress_reward=0"):
        OracleProgress(NoOracle(), 0.1).reset(seed=0)


def test_wrappers_await_the_inner_coroutines_and_forward_everything():
    class AsyncCounter(Counter):
        async def astep(self, action_text):
            out = self.step(action_text)
            return out[0] + " (async)", *out[1:]

    env = make("frozenlake-v0")
    assert env.instructions.startswith("You play FrozenLake") and env.max_actions_per_turn == 1
    assert type(env.unwrapped).__name__ == "FrozenLake" and len(env.examples()) == 2
    wrapped = EpisodeStatistics(TurnLimit(InvalidActionPenalty(AsyncCounter(goal=1), 0.1), 3))
    asyncio.run(wrapped.areset(seed=0))
    obs, _, term, _, info = asyncio.run(wrapped.astep("up"))
    assert obs == "counter 1 (async)" and term and info["episode"]["length"] == 1
    wrapped.close()
    wrapped.close()


# ---- check_env --------------------------------------------------------------------------------------------

# Registered ids that cannot pass with default arguments and random_tasks=True:
_NEEDS_SERVER = {"openenv-v0"}  # needs url=...; tests/test_adapters_openenv.py checks it on a loopback server
_FIXED_TASK = {"gym-cliffwalking-v0"}  # one fixed grid


@pytest.mark.parametrize("env_id", sorted(set(registered()) - _NEEDS_SERVER))
def test_every_registered_env_passes_check_env(env_id):
    check_env(env_id, random_tasks=env_id not in _FIXED_TASK)


def test_check_env_passes_a_fixed_task_env_and_warns_it_looks_fixed():
    with pytest.warns(UserWarning, match="all gave the same task"):
        check_env(TurnLimit(Counter(), 5))
    check_env(TurnLimit(Counter(), 5), random_tasks=False)
    with pytest.raises(EnvCheckError, match="all gave the same task"):
        check_env(TurnLimit(Counter(), 5), random_tasks=True)


class _IgnoresSeed(Counter):
    def reset(self, *, seed=None, options=None):
        import random

        self.n = 0
        return f"counter 0 ({random.random()})", {}


class _BadComponents(Counter):
    def step(self, action_text):
        obs, r, term, trunc, info = super().step(action_text)
        return obs, r + 0.5, term, trunc, info


class _RaisesOnGarbage(Counter):
    def step(self, action_text):
        if action_text.strip().lower() != "up":
            raise ValueError("bad action")
        return super().step(action_text)


class _AcceptsGarbage(Counter):
    def step(self, action_text):
        return super().step("up")


class _AsyncDisagrees(Counter):
    async def astep(self, action_text):
        obs, *rest = self.step(action_text)
        return obs.upper(), *rest


@pytest.mark.parametrize(
    "env, message",
    [
        (_IgnoresSeed(), "different observations"),
        (_BadComponents(), "sum to"),
        (_RaisesOnGarbage(), "bad action"),
        (_AcceptsGarbage(), "garbage text was accepted"),
        (_AsyncDisagrees(), "areset/astep disagree"),
        (Counter(goal=10), "did not reach success"),  # the plan needs 10 turns; the limit is 3
    ],
)
def test_check_env_catches_broken_envs(env, message):
    with pytest.raises(Exception, match=message):
        check_env(TurnLimit(env, 3), random_tasks=False)


class _ParsesInt(Counter):
    """Reads the count straight from the text: int() raises on the oracle's 'up'."""

    def step(self, action_text):
        self.n = int(action_text)
        return super().step("up")


class _NoValidKey(Counter):
    def step(self, action_text):
        obs, r, term, trunc, info = super().step(action_text)
        del info["valid"]
        return obs, r, term, trunc, info


def test_check_env_reports_an_env_that_raises_as_an_env_check_error_with_the_fix(scratch_registry):
    with pytest.raises(EnvCheckError, match=r"seed 0: step\('up'\) raised ValueError: invalid literal for int\(\).*Fix: never raise"):
        check_env(TurnLimit(_ParsesInt(), 3), random_tasks=False)
    register("no-valid-v0", _NoValidKey)  # make's wrappers read info["valid"]
    with pytest.raises(EnvCheckError, match=r"raised KeyError: 'valid'. Fix: step\(\) must return info\['valid'\]"):
        check_env("no-valid-v0", random_tasks=False)
    with pytest.raises(EnvCheckError, match="make\\('counter-v9'.*UnknownEnvError"):
        check_env("counter-v9")


class _SecretGoal(Counter):
    """Every seed's task looks the same ('counter 0') but hides a different goal."""

    def reset(self, *, seed=None, options=None):
        self.goal = 1 + (seed or 0) % 3
        return super().reset(seed=seed, options=options)


class _KeyedSecretGoal(_SecretGoal):
    def task_key(self):
        return f"goal {self.goal}"


def test_tasks_that_differ_in_hidden_state_are_told_apart_by_their_task_key():
    check_env(TurnLimit(_KeyedSecretGoal(), 5), random_tasks=True)  # no warning, no error
    with pytest.warns(UserWarning, match="override task_key"):  # the default key is the (same) first observation
        check_env(TurnLimit(_SecretGoal(), 5))


class _KeyFollowsState(Counter):
    def task_key(self):
        return str(self.n)


class _KeyIsNotText(Counter):
    def task_key(self):
        return self.n


class _SituationIsNotText(Counter):
    def situation(self):
        return self.n


@pytest.mark.parametrize("env, message", [
    (_KeyFollowsState(), "task_key\\(\\) changed during the episode"),
    (_KeyIsNotText(), "task_key\\(\\) returned a int"),
    (_SituationIsNotText(), "situation\\(\\) returned a int"),
])
def test_check_env_checks_the_task_key(env, message):
    with pytest.raises(EnvCheckError, match=message):
        check_env(TurnLimit(env, 5), random_tasks=False)


def test_the_default_task_key_is_the_first_observation_and_wrappers_forward_it():
    env = make("frozenlake-v0")  # FrozenLake overrides it; Counter keeps the default
    with pytest.raises(RuntimeError, match="before reset"):
        Counter().task_key()
    counter = TurnLimit(Counter(), 5)
    asyncio.run(counter.areset(seed=0))
    counter.step("up")
    assert counter.task_key() == "counter 0" == counter.unwrapped.task_key()
    env.reset(seed=0)
    assert env.task_key() == env.unwrapped.task_key() == "/".join(env.unwrapped.desc)


class _Sleepy(Counter):
    blocking_io = True

    def reset(self, *, seed=None, options=None):
        time.sleep(0.3)
        return super().reset(seed=seed, options=options)

    def step(self, action_text):
        time.sleep(0.3)
        return super().step(action_text)


def test_envs_that_do_io_run_off_the_event_loop_and_the_rest_inline():
    """A blocking_io env's steps overlap (4 x 0.6 s of sleeps take ~0.6 s, not 2.4 s); a computing env is called inline,
    on the event loop's own thread, which keeps rollouts deterministic."""
    threads = []

    class Inline(Counter):
        def step(self, action_text):
            threads.append(threading.current_thread())
            return super().step(action_text)

    env = Inline()

    async def one():
        await env.areset(seed=0)
        await env.astep("up")
        return threading.current_thread()

    assert threads == [asyncio.run(one())]
    envs = [_Sleepy() for _ in range(4)]

    async def episode_starts():
        await asyncio.gather(*(env.areset(seed=0) for env in envs))
        return await asyncio.gather(*(env.astep("up") for env in envs))

    start = time.monotonic()
    results = asyncio.run(episode_starts())
    assert time.monotonic() - start < 1.8  # 4 x (0.3 + 0.3) s one after another would take 2.4 s
    assert [r[0] for r in results] == ["counter 1"] * 4


# ---- play -------------------------------------------------------------------------------------------------

def test_play_scripted_session():
    inputs = iter(["?", "Down", "nonsense", "q"])
    out = []
    summary = play("frozenlake-v0", seed=0, map_name="4x4", input_fn=lambda _: next(inputs),
                   print_fn=lambda *a: out.append(" ".join(map(str, a))))
    text = "\n".join(out)
    assert text.startswith("You play FrozenLake") and "oracle: Down" in text and "Invalid action" in text
    assert summary == {"return": 0.0, "turns": 2, "success": False, "termination": "quit"}


def test_play_to_the_goal_and_end_of_input():
    inputs = iter(["Right", "Right", "Down", "Down", "Down", "Right"])
    out = []
    summary = play("frozenlake-v0", seed=0, map_name="4x4", input_fn=lambda _: next(inputs), print_fn=out.append)
    assert summary == {"return": 1.0, "turns": 6, "success": True, "termination": "terminated"}
    assert "You reached the goal." in out[-2] and "episode over: terminated" in out[-1]

    def eof(_):
        raise EOFError

    assert play("sokoban-v0", seed=1, input_fn=eof, print_fn=lambda *a: None)["termination"] == "quit"
