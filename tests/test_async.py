"""Async off-policy collection (turnrl.scale.async_rollout): per-turn policy versions, the staleness gate and bound,
the locked engine, and a 2-step async run on a tiny model."""

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from turnrl.build import build
from turnrl.config import ConfigError, load_config
from turnrl.agent.context import ContextSpec
from turnrl.engines import Completion, HFEngine, SamplingParams
from turnrl.envs import Env, register
from turnrl.learner import build_samples
from turnrl.loop import train
from turnrl.monitor.sinks import read_metrics
from turnrl.rollout import Collector, RolloutStats
from turnrl.scale.async_rollout import AsyncCollection, LockedEngine, collection, drop_stale, staleness_metrics
from turnrl.types import Advantages, Trajectory, TrajectoryGroup, Turn


class Counter(Env):
    """Three turns; pays 1 for an even-length answer (a random tiny model gets varied rewards). ``on_step`` runs
    inside each step, where a test lands a weight sync mid-episode."""

    instructions = "Answer."
    on_step = None

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return f"task {seed}", {}

    def step(self, action_text):
        self.t += 1
        if self.on_step is not None:
            self.on_step(self.t)
        r = float(len(action_text) % 2 == 0)
        done = self.t >= 3
        return f"turn {self.t}", r, done, False, {"actions": [action_text], "valid": True, "success": done and r > 0,
                                                  "reward_components": {"outcome": r}}


@pytest.fixture
def counter_env(monkeypatch):
    """``async-counter-v0`` registered for one test only (a module-level registration would reach every test that
    walks the registry, e.g. tests/test_envs.py's check of every registered env)."""
    from turnrl.envs import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register("async-counter-v0", Counter, description="test env")


class VersionedEngine:
    """Answers every prompt with 'ab' + EOS, stamped with its weight version; ``sync_weights`` bumps it."""

    def __init__(self, tokenizer):
        self.version = 0
        self.ids = tokenizer.encode("ab", add_special_tokens=False) + [tokenizer.eos_token_id]

    def generate(self, prompts, params):
        return [Completion(list(self.ids), [-0.5] * len(self.ids), "stop", version=self.version) for _ in prompts]

    def sync_weights(self):
        self.version += 1

    def state_dict(self):
        return {"version": self.version}

    def load_state_dict(self, state):
        self.version = state["version"]


def _turns(*versions: int) -> list[Turn]:
    return [Turn([1, 2], [3, 4], [-0.1, -0.2], "obs", "ab", version=v) for v in versions]


def test_each_turn_keeps_the_version_that_sampled_it_across_a_mid_episode_sync(tokenizer):
    engine = LockedEngine(VersionedEngine(tokenizer), threading.Condition())

    def env():
        e = Counter()
        e.on_step = lambda t: engine.sync_weights() if t == 1 else None  # the learner's sync lands after turn 1
        return e

    for context in ("per_step", "full"):
        collector = Collector(engine, tokenizer, env, ContextSpec(strategy=context))
        (group,) = collector.collect([7], 1, SamplingParams(max_new_tokens=4, temperature=0.0))
        traj = group.trajectories[0]
        before = engine.version - 1
        assert [t.version for t in traj.turns] == [before, before + 1, before + 1]
        assert traj.policy_version == before + 1
        samples = build_samples([traj], Advantages.zeros([traj]))
        loss_versions = [v for s in samples for v, m in zip(s.policy_versions, s.loss_mask) if m]
        n = len(engine.engine.ids)  # response tokens per turn
        assert loss_versions == [before] * n + [before + 1] * 2 * n
        assert all(len(s.policy_versions) == len(s) for s in samples)


def test_the_staleness_bound_drops_whole_groups_holding_an_older_turn():
    fresh = TrajectoryGroup("e", 0, [Trajectory("e", 0, _turns(3, 4)), Trajectory("e", 0, _turns(4))])
    partial = TrajectoryGroup("e", 1, [Trajectory("e", 1, _turns(2, 3, 4)), Trajectory("e", 1, _turns(4, 4))])
    empty = TrajectoryGroup("e", 2, [Trajectory("e", 2, [])])  # an env error before any turn: nothing stale
    kept, dropped = drop_stale([fresh, partial, empty], oldest=3)
    assert kept == [fresh, empty] and dropped == 2
    kept, dropped = drop_stale([fresh, partial, empty], oldest=2)
    assert kept == [fresh, partial, empty] and dropped == 0


def test_staleness_metrics_are_over_loss_tokens():
    traj = Trajectory("e", 0, _turns(2, 4), context="full")
    samples = build_samples([traj], Advantages.zeros([traj]))
    assert staleness_metrics(samples, 5) == {"train/staleness_mean": 2.0, "train/staleness_max": 3.0}
    assert staleness_metrics([], 5) == {}


# ---------------------------------------------------------------------------------------------- the producer


@dataclass
class Parts:
    cfg: Any
    engine: Any
    collector: Any
    eval_collector: Any = None
    started: list = field(default_factory=list)


def _parts(tokenizer, max_staleness=1, steps=4) -> Parts:
    cfg = load_config(None, [f"train.steps={steps}", "scale.async_mode=true", f"scale.max_staleness={max_staleness}"])
    engine = VersionedEngine(tokenizer)
    return Parts(cfg, engine, SimpleNamespace(engine=engine, stats=RolloutStats()))


def _collect(fail_at: int = -1):
    """A step's batch: one group whose one turn carries the engine version the step started at."""
    def collect(parts, step):
        if step == fail_at:
            raise ValueError(f"env broke at step {step}")
        parts.started.append((step, parts.engine.version))
        group = TrajectoryGroup("e", step, [Trajectory("e", step, _turns(parts.engine.version))])
        return [group], [group], [step], RolloutStats()
    return collect


def _wait_for(cond, timeout=10.0) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def test_the_producer_runs_at_most_max_staleness_steps_ahead(tokenizer):
    c = _parts(tokenizer, max_staleness=1)
    raw = c.engine
    with collection(c, _collect()) as collect:
        assert isinstance(collect, AsyncCollection)
        groups, _, tasks, _ = collect(0)
        assert tasks == [0] and isinstance(c.engine, LockedEngine) and c.collector.engine is c.engine
        assert _wait_for(lambda: len(c.started) == 2)  # step 1 goes on while the learner updates on step 0
        time.sleep(0.3)
        assert c.started == [(0, 0), (1, 0)]  # step 2 waits for the learner's first sync
        c.engine.sync_weights()
        assert _wait_for(lambda: len(c.started) == 3) and c.started[2] == (2, 1)
        groups, _, tasks, _ = collect(1)  # sampled at version 0, learner at 1: within the bound
        assert tasks == [1] and len(groups) == 1 and collect.last_metrics == {"rollout/stale_dropped": 0.0}
        c.engine.sync_weights()
        c.engine.sync_weights()  # the learner moved two versions past step 2's batch (version 1): 3 - 1 > 1
        groups, _, _, _ = collect(2)
        assert groups == [] and collect.last_metrics == {"rollout/stale_dropped": 1.0}
    assert c.engine is raw and c.collector.engine is raw  # closing gives the engine back


def test_max_staleness_zero_collects_nothing_ahead_and_a_restart_recollects(tokenizer):
    c = _parts(tokenizer, max_staleness=0)
    with collection(c, _collect()) as collect:
        collect(0)
        time.sleep(0.3)
        assert c.started == [(0, 0)]
        c.engine.sync_weights()
        assert _wait_for(lambda: len(c.started) == 2)
        collect.restart()  # e.g. a rollback: what was collected ahead is dropped and collected again
        c.engine.sync_weights()
        collect(1)
        assert [s for s, _ in c.started] == [0, 1, 1]


def test_a_producer_error_reaches_the_loop(tokenizer):
    c = _parts(tokenizer)
    with collection(c, _collect(fail_at=1)) as collect:
        collect(0)
        with pytest.raises(ValueError, match="env broke at step 1"):
            collect(1)


def test_async_mode_refuses_what_it_cannot_run_safely(tokenizer, tiny_model):
    c = _parts(tokenizer)
    c.engine = HFEngine(tiny_model, tokenizer)
    with pytest.raises(ConfigError, match="rollout.engine=native"):
        AsyncCollection(c, _collect(), 1)
    c = _parts(tokenizer)
    c.cfg.scale.workers = 2
    with pytest.raises(ConfigError, match="scale.workers=0"):
        AsyncCollection(c, _collect(), 1)


# ---------------------------------------------------------------------------------------------- a real run


def test_an_async_run_of_two_steps_completes_and_logs_staleness_and_is_metrics(tmp_path, tokenizer, counter_env):
    from turnrl.models import tiny_model

    cfg = load_config(None, [
        "train.steps=2", "rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=3",
        "eval.num_tasks=2", "eval.every=1", "log.progress=false", "log.tensorboard=false", "train.lr=1e-3",
        "train.micro_batch_tokens=256", "model.autocast_bf16=false", "env.id=async-counter-v0", "env.progress_reward=0",
        "rollout.engine=native", "scale.async_mode=true", "scale.max_staleness=1", "algo.is_correction=tis",
        "algo.skip_zero_advantage=false", f"log.run_dir={tmp_path}", "log.name=async",
    ])
    c = build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
    engine = c.engine
    run_dir = train(cfg, components=c)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    first, second = rows[1], rows[2]
    assert first["train/staleness_max"] == 0.0  # step 0's batch was sampled before any update
    assert 0.0 <= second["train/staleness_mean"] <= second["train/staleness_max"] <= 1.0
    assert second["rollout/stale_dropped"] == 0.0 and second["train/num_tokens"] > 0
    for key in ("train/is_ratio_mean", "train/is_ratio_max", "train/is_ratio_min", "train/is_truncated_frac"):
        assert key in second
    assert "eval/success_rate" in second
    assert c.engine is engine and engine.version == 2  # the engine is given back, synced once per step
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000002"
