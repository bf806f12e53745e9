"""The collector keeps exact token ids: what the learner trains on is what the engine conditioned on."""

import asyncio
import time

import pytest

from turnrl.engines import HFEngine, SamplingParams
from turnrl.envs.base import Env
from turnrl.learner import build_samples
from turnrl.agent import ContextSpec
from turnrl.rollout import Collector, RolloutStats
from turnrl.types import Advantages, Termination


class CountEnv(Env):
    """Counts turns; terminates after `goal` turns; answers every response with a numbered observation."""

    instructions = "Say anything."

    def __init__(self, goal=3, fail_at=None):
        self.goal, self.fail_at, self.t = goal, fail_at, 0

    def reset(self, *, seed=None, options=None):
        self.t, self.seed = 0, seed
        return f"start {seed}", {}

    def step(self, action_text):
        self.t += 1
        if self.fail_at is not None and self.t == self.fail_at:
            raise RuntimeError("boom")
        done = self.t >= self.goal
        comps = {"outcome": 1.0 if done else 0.0}
        return f"observation number {self.t}", comps["outcome"], done, False, {"success": done, "valid": True, "reward_components": comps}

    def anchor(self):
        return str(self.t)

    def examples(self):
        return [("start -1", "hello")]


class RecordingEngine(HFEngine):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.seen = []

    def generate(self, prompts, params):
        outs = super().generate(prompts, params)
        self.seen.extend(zip([list(p) for p in prompts], [o.token_ids for o in outs]))
        return outs


@pytest.mark.parametrize("strategy", ["per_step", "full", "budgeted"])
def test_samples_are_exactly_what_the_engine_conditioned_on(tokenizer, tiny_model, strategy):
    engine = RecordingEngine(tiny_model, tokenizer, seed=0)
    budget = 120 if strategy == "budgeted" else 0  # small enough that the oldest exchanges are dropped
    spec = ContextSpec(strategy=strategy, history_turns=1, budget_tokens=budget)
    col = Collector(engine, tokenizer, lambda: CountEnv(goal=3), spec)
    groups = col.collect([7, 8], group_size=2, sampling=SamplingParams(max_new_tokens=4, temperature=1.0))
    trajs = [t for g in groups for t in g.trajectories]
    assert all(t.termination == Termination.TERMINATED and t.success and t.num_turns == 3 for t in trajs)
    samples = build_samples(trajs, Advantages([[1.0] * t.num_turns for t in trajs]))
    seen = {tuple(p + r) for p, r in engine.seen}
    for s in samples:
        # every masked-in run of tokens is a response the engine produced right after exactly the ids before it,
        # so the ids are what the engine conditioned on and no observation/template token carries loss
        assert tuple(s.input_ids) in seen or strategy == "full"
        for i, m in enumerate(s.loss_mask):
            if m and (i == 0 or not s.loss_mask[i - 1]):
                end = i
                while end < len(s.loss_mask) and s.loss_mask[end]:
                    end += 1
                assert (s.input_ids[:i], s.input_ids[i:end]) in [(p, r) for p, r in engine.seen]
    if strategy == "full":
        # one sample per trajectory whose ids equal the last prompt the engine saw plus its response
        last = max(engine.seen, key=lambda pr: len(pr[0]))
        assert any(s.input_ids == last[0] + last[1] for s in samples)
        assert len(samples) == len(trajs)
    else:
        assert len(samples) == sum(t.num_turns for t in trajs)


def test_env_error_ends_only_that_episode(tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tokenizer)
    envs = iter([CountEnv(goal=3, fail_at=2), CountEnv(goal=3)])
    col = Collector(engine, tokenizer, lambda: next(envs))
    groups = col.collect([0, 1], group_size=1, sampling=SamplingParams(max_new_tokens=2))
    a, b = groups[0].trajectories[0], groups[1].trajectories[0]
    assert a.termination == Termination.ENV_ERROR and "boom" in a.error
    assert b.termination == Termination.TERMINATED and b.num_turns == 3


def test_context_budget_truncates_episode(tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tokenizer)
    col = Collector(engine, tokenizer, lambda: CountEnv(goal=50), ContextSpec(strategy="full", max_context_tokens=90))
    traj = col.collect([0], 1, SamplingParams(max_new_tokens=8))[0].trajectories[0]
    assert traj.termination == Termination.TRUNCATED_CONTEXT
    assert 0 < traj.num_turns < 50


def test_groups_share_seed_and_record_anchor_and_version(tokenizer, tiny_model):
    engine = HFEngine(tiny_model, tokenizer)
    engine.sync_weights()
    col = Collector(engine, tokenizer, lambda: CountEnv(goal=2))
    groups = col.collect([4, 5], 3, SamplingParams(max_new_tokens=2))
    assert [g.seed for g in groups] == [4, 5]
    assert all(t.seed == g.seed and t.policy_version == 1 for g in groups for t in g.trajectories)
    assert [turn.anchor for turn in groups[0].trajectories[0].turns] == ["0", "1"]


def test_stats_accumulate_over_collect_calls_until_taken(tokenizer, tiny_model):
    greedy = SamplingParams(max_new_tokens=3, temperature=0.0)
    once = Collector(HFEngine(tiny_model, tokenizer), tokenizer, lambda: CountEnv(goal=2))
    once.collect([0, 1], 2, greedy)
    one = once.take_stats()
    assert one.prompt_tokens > 0 and one.generated_tokens > 0 and one.generate_s > 0
    twice = Collector(HFEngine(tiny_model, tokenizer), tokenizer, lambda: CountEnv(goal=2))
    twice.collect([0, 1], 2, greedy)
    twice.collect([0, 1], 2, greedy)  # e.g. a second dynamic-sampling round, or ReMax's greedy baseline
    two = twice.take_stats()
    assert (two.prompt_tokens, two.generated_tokens) == (2 * one.prompt_tokens, 2 * one.generated_tokens)
    assert twice.take_stats() == RolloutStats()  # taking resets


class SlowCountEnv(CountEnv):
    """A CountEnv whose ``astep`` waits like a network call, so concurrent episodes' waits overlap."""

    async def astep(self, action_text):
        await asyncio.sleep(0.05)
        return self.step(action_text)


def test_session_engine_stats_are_wall_time_not_a_sum_over_concurrent_episodes(tokenizer, tiny_model):
    from turnrl.engines.native import NativeEngine

    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=8, max_len=512)
    col = Collector(engine, tokenizer, lambda: SlowCountEnv(goal=3))
    t0 = time.perf_counter()
    col.collect([0, 1, 2, 3], 2, SamplingParams(max_new_tokens=3, temperature=0.0))
    wall = time.perf_counter() - t0
    stats = col.take_stats()
    # 8 episodes x 3 steps x 50 ms = 1.2 s of summed waits; the waits overlap, so the env's wall share is far less
    assert 0.15 <= stats.env_s <= wall
    assert 0 < stats.generate_s <= wall


class KeyedEnv(CountEnv):
    def __init__(self, key):
        super().__init__(goal=2)
        self.key = key

    def task_key(self):
        if isinstance(self.key, Exception):
            raise self.key
        return self.key.format(seed=self.seed)


@pytest.mark.parametrize("key, want", [
    ("map-{seed}", "map-5"),
    (NotImplementedError(), None),
    (RuntimeError("no key today"), None),  # a failing task_key() never fails the episode
])
def test_trajectories_record_the_task_key(tokenizer, tiny_model, key, want):
    col = Collector(HFEngine(tiny_model, tokenizer), tokenizer, lambda: KeyedEnv(key))
    traj = col.collect([5], 1, SamplingParams(max_new_tokens=2))[0].trajectories[0]
    assert traj.task_key == want
    assert traj.termination == Termination.TERMINATED and traj.error is None
