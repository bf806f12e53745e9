"""ReMax: the greedy rollout's reward is the baseline."""

from __future__ import annotations

import pytest

from turnrl import credit
from turnrl.credit import CreditParams, estimator_flag
from turnrl.types import Trajectory, TrajectoryGroup, Turn


def _group(rewards, seed=0):
    trajs = [Trajectory("e", seed, [Turn([1], [2], [-0.1], "o", "r", reward=0.0), Turn([1], [2], [-0.1], "o", "r", reward=r)])
             for r in rewards]
    return TrajectoryGroup("e", seed, trajs)


def test_baseline_is_greedy_reward_per_group():
    adv = credit.remax([_group([1.0, 0.0]), _group([0.5])], CreditParams(baseline_rewards=(0.25, 1.0)))
    assert adv.turns == [[0.75, 0.75], [-0.25, -0.25], [-0.5, -0.5]]


def test_needs_the_greedy_baseline():
    assert estimator_flag(credit.get_estimator("remax"), "needs_greedy_baseline")
    assert not estimator_flag(credit.get_estimator("grpo"), "needs_greedy_baseline")
    with pytest.raises(ValueError, match="baseline_rewards"):
        credit.remax([_group([1.0])], CreditParams())
    with pytest.raises(ValueError, match="1 groups but 2"):
        credit.remax([_group([1.0])], CreditParams(baseline_rewards=(0.0, 1.0)))


# ------------------------------------------------------------------ the loop collects greedy baselines


def test_smoke_run_collects_one_greedy_episode_per_task(tmp_path, tokenizer, monkeypatch):
    from tests.test_train import _run
    from turnrl.rollout import Collector

    calls = []
    real = Collector.collect

    def spy(self, seeds, group_size, sampling, **kw):
        calls.append((list(seeds), group_size, sampling.temperature))
        return real(self, seeds, group_size, sampling, **kw)

    monkeypatch.setattr(Collector, "collect", spy)
    _run(tmp_path, tokenizer, ["algo.estimator=remax", "eval.every=0", "eval.at_start=false"], "remax")
    # per step: the sampled groups, then one greedy episode for each of the same seeds; final eval last
    assert calls[0][1:] == (2, 1.0) and calls[1] == (calls[0][0], 1, 0.0)
    assert calls[2][1:] == (2, 1.0) and calls[3] == (calls[2][0], 1, 0.0)


# ------------------------------------------------------------------ reward shaping before credit


def test_running_norm_matches_numpy_and_kl_penalty_is_a_component():
    import numpy as np

    from turnrl.credit.rewards import KLController, RewardShaper, RunningMeanStd

    rng = np.random.default_rng(0)
    xs = rng.normal(2.0, 3.0, size=50)
    rms = RunningMeanStd()
    rms.update(xs[:20].tolist())
    rms.update(xs[20:].tolist())
    assert rms.mean == pytest.approx(xs.mean()) and rms.std == pytest.approx(xs.std())
    shaper = RewardShaper(kl_beta=0.5)
    g = _group([1.0])
    shaper.apply([g], [[0.2, 0.4]])
    turns = g.trajectories[0].turns
    assert [t.reward for t in turns] == pytest.approx([-0.1, 0.8])
    assert turns[1].reward_components["kl"] == pytest.approx(-0.2)
    with pytest.raises(ValueError, match="one KL per turn"):
        shaper.apply([g], None)
    ctl = KLController(0.1, target=1.0, horizon=10)
    ctl.update(kl=10.0, n=5)  # far above target: error clipped to 0.2 -> beta * (1 + 0.2 * 5 / 10)
    assert ctl.beta == pytest.approx(0.11)


def test_a_group_whose_greedy_episode_failed_has_no_baseline():
    adv = credit.remax([_group([1.0, 0.0]), _group([0.5])], CreditParams(baseline_rewards=(None, 1.0)))
    assert adv.turns == [[0.0, 0.0], [0.0, 0.0], [-0.5, -0.5]]
