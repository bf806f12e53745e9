"""A faulty env ends only its own episode: slow steps, raising anchor()/close(), wrong-shape replies, huge observations.

Every fault runs through both collector paths: lock step (a plain engine, :class:`HFEngine`) and one coroutine per
episode (a session engine, :class:`NativeEngine`).
"""

import asyncio
import threading
import time

import pytest

from turnrl.agent import ContextSpec
from turnrl.engines import HFEngine, SamplingParams
from turnrl.engines.native import NativeEngine
from turnrl.rollout import Collector
from turnrl.types import Termination

from tests.test_rollout import CountEnv

SAMPLING = SamplingParams(max_new_tokens=2)


@pytest.fixture(params=["lock_step", "session"])
def engine(request, tokenizer, tiny_model):
    if request.param == "lock_step":
        return HFEngine(tiny_model, tokenizer)
    return NativeEngine(tiny_model, tokenizer, dtype="fp32", max_len=1024)


@pytest.fixture
def release():
    """An event a sleeping sync env waits on; set at teardown so no worker thread outlives the test."""
    event = threading.Event()
    yield event
    event.set()


class SlowEnv(CountEnv):
    """Its ``slow`` call (``"reset"`` or ``"step"``) blocks a worker thread until ``release`` is set (at most 30 s)."""

    blocking_io = True  # a sync env that waits: its calls run in a worker thread, where a timeout can leave them

    def __init__(self, slow: str, release: threading.Event):
        super().__init__(goal=3)
        self.slow, self.release = slow, release

    def reset(self, *, seed=None, options=None):
        if self.slow == "reset":
            self.release.wait(30)
        return super().reset(seed=seed, options=options)

    def step(self, action_text):
        if self.slow == "step" and self.t == 1:
            self.release.wait(30)
        return super().step(action_text)


class AsyncSlowEnv(CountEnv):
    """A real coroutine env whose ``slow`` call sleeps 30 s on the event loop (cancellable)."""

    def __init__(self, slow: str):
        super().__init__(goal=3)
        self.slow = slow

    async def areset(self, *, seed=None, options=None):
        if self.slow == "reset":
            await asyncio.sleep(30)
        return self.reset(seed=seed, options=options)

    async def astep(self, action_text):
        if self.slow == "step" and self.t == 1:
            await asyncio.sleep(30)
        return self.step(action_text)


class FaultEnv(CountEnv):
    """Breaks in one named way (``fault``) at its second turn; an otherwise normal :class:`CountEnv`."""

    def __init__(self, fault: str):
        super().__init__(goal=3)
        self.fault = fault

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return (None, info) if self.fault == "reset_none" else (obs, info)

    def step(self, action_text):
        obs, reward, terminated, truncated, info = super().step(action_text)
        if self.t == 2 and self.fault == "step_none":
            return None, reward, terminated, truncated, info
        if self.t == 2 and self.fault == "step_shape":
            return obs, reward
        return obs, reward, terminated, truncated, info

    def anchor(self):
        if self.fault == "anchor" and self.t == 1:
            raise RuntimeError("anchor exploded")
        return super().anchor()

    def close(self):
        if self.fault == "close":
            raise OSError("close exploded")


def _run(engine, tokenizer, faulty, timeout_s=0.0, ctx=ContextSpec()):
    """One faulty episode (seed 0) beside two healthy ones (seeds 1, 2); returns (faulty, healthy trajectories)."""
    envs = iter([faulty, CountEnv(goal=3), CountEnv(goal=3)])
    col = Collector(engine, tokenizer, lambda: next(envs), ctx, step_timeout_s=timeout_s)
    groups = col.collect([0, 1, 2], group_size=1, sampling=SAMPLING)
    bad, *good = [g.trajectories[0] for g in groups]
    assert all(t.termination == Termination.TERMINATED and t.num_turns == 3 and t.error is None for t in good)
    return bad, good


@pytest.mark.parametrize("slow", ["reset", "step"])
@pytest.mark.parametrize("kind", ["sync", "async"])
@pytest.mark.probe("fault")
def test_a_slow_env_ends_only_its_episode_at_the_timeout(engine, tokenizer, release, slow, kind):
    faulty = SlowEnv(slow, release) if kind == "sync" else AsyncSlowEnv(slow)
    t0 = time.perf_counter()
    bad, _ = _run(engine, tokenizer, faulty, timeout_s=0.5)
    assert time.perf_counter() - t0 < 20  # not the 30 s the env sleeps (a loose bound: the machine may be busy)
    assert bad.termination == Termination.ENV_ERROR
    assert bad.error == f"{slow} took longer than 0.5 s (env.step_timeout_s)"
    assert bad.num_turns == (0 if slow == "reset" else 2)  # the timed-out turn is kept, marked invalid
    if slow == "step":
        assert not bad.turns[-1].valid


@pytest.mark.probe("fault")
def test_an_env_raising_timeout_error_is_not_reported_as_slow(engine, tokenizer):
    class RaisesTimeout(CountEnv):
        def step(self, action_text):
            raise TimeoutError("the server did not answer")

    bad, _ = _run(engine, tokenizer, RaisesTimeout(), timeout_s=5.0)
    assert bad.error == "step failed: TimeoutError: the server did not answer"


@pytest.mark.parametrize("fault, error, turns", [
    ("anchor", "anchor failed: RuntimeError: anchor exploded", 2),
    ("reset_none", "reset returned a NoneType observation; an observation is str", 0),
    ("step_none", "step returned a NoneType observation; an observation is str", 2),
    ("step_shape", "step returned a tuple of 2, not (observation, reward, terminated, truncated, info)", 2),
])
@pytest.mark.probe("fault")
def test_a_broken_env_ends_only_its_episode(engine, tokenizer, fault, error, turns):
    bad, _ = _run(engine, tokenizer, FaultEnv(fault))
    assert bad.termination == Termination.ENV_ERROR
    assert bad.error == error
    assert bad.num_turns == turns


@pytest.mark.probe("fault")
def test_close_raising_is_recorded_without_failing_the_episode(engine, tokenizer):
    bad, _ = _run(engine, tokenizer, FaultEnv("close"))
    assert bad.termination == Termination.TERMINATED and bad.num_turns == 3
    assert bad.error == "close failed: OSError: close exploded"


@pytest.mark.probe("fault")
def test_close_raising_after_an_env_error_keeps_both_messages(engine, tokenizer):
    class Both(FaultEnv):
        def step(self, action_text):
            raise RuntimeError("step exploded")

    bad, _ = _run(engine, tokenizer, Both("close"))
    assert bad.termination == Termination.ENV_ERROR
    assert bad.error == "step failed: RuntimeError: step exploded; close failed: OSError: close exploded"


class TimedTokenizer:
    """The tokenizer, counting the seconds spent encoding and the longest text it was asked to encode."""

    def __init__(self, inner):
        self.inner, self.seconds, self.longest = inner, 0.0, 0

    def __call__(self, text, **kwargs):
        t0 = time.perf_counter()
        out = self.inner(text, **kwargs)
        self.seconds += time.perf_counter() - t0
        self.longest = max(self.longest, len(text))
        return out

    def apply_chat_template(self, messages, **kwargs):
        t0 = time.perf_counter()
        out = self.inner.apply_chat_template(messages, **kwargs)
        self.seconds += time.perf_counter() - t0
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


HUGE = 32 * 2**20  # characters: the 32 MB observation that took 133 s and 9 GB


class HugeEnv(CountEnv):
    """Its reset observation, or its first step's, is 32 MB of text."""

    def __init__(self, where: str):
        super().__init__(goal=3)
        self.where = where

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return ("word " * (HUGE // 5) if self.where == "reset" else obs), info

    def step(self, action_text):
        obs, *rest = super().step(action_text)
        return ("word " * (HUGE // 5) if self.where == "step" and self.t == 1 else obs), *rest


@pytest.mark.parametrize("strategy", ["per_step", "full"])
@pytest.mark.parametrize("where", ["reset", "step"])
@pytest.mark.probe("fault")
def test_a_huge_observation_is_cut_before_it_is_tokenized(tokenizer, tiny_model, strategy, where):
    timed = TimedTokenizer(tokenizer)
    cap = 64
    ctx = ContextSpec(strategy=strategy, max_observation_tokens=cap, max_context_tokens=4096)
    col = Collector(HFEngine(tiny_model, tokenizer), timed, lambda: HugeEnv(where), ctx)
    traj = col.collect([0], 1, SAMPLING)[0].trajectories[0]
    assert traj.termination == Termination.TERMINATED and traj.num_turns == 3
    cut = traj.turns[0 if where == "reset" else 1]
    assert cut.info["observation_truncated"] == len("word " * (HUGE // 5))
    assert len(tokenizer(cut.observation, add_special_tokens=False)["input_ids"]) <= cap
    assert cut.observation and ("word " * (HUGE // 5)).startswith(cut.observation)
    assert all("observation_truncated" not in t.info for t in traj.turns if t is not cut)
    assert timed.seconds < 1.0 and timed.longest < 100_000  # the tokenizer never saw the whole text
