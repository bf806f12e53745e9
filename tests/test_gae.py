"""GAE estimators: hand-computed cases, loop vs vectorised, truncation bootstraps, layouts and whitening."""

from __future__ import annotations

import random

import numpy as np
import pytest

from turnrl import credit
from turnrl.credit import CreditParams, ValueInputs
from turnrl.credit.gae import gae, gae_loop
from turnrl.learner import build_samples
from turnrl.types import Advantages, Termination, Trajectory, TrajectoryGroup, Turn


def _turn(reward: float, n_tokens: int = 1) -> Turn:
    return Turn(prompt_ids=[1, 2], response_ids=[3] * n_tokens, logprobs=[-0.1] * n_tokens, observation="o",
                response_text="r", reward=reward)


def _traj(rewards, lengths=None, termination=Termination.TERMINATED) -> Trajectory:
    lengths = lengths or [1] * len(rewards)
    return Trajectory(env_id="e", seed=0, turns=[_turn(r, n) for r, n in zip(rewards, lengths)], termination=termination)


def _params(values, bootstrap, **kw) -> CreditParams:
    kw.setdefault("whiten", False)
    return CreditParams(values=ValueInputs(token_values=values, bootstrap=bootstrap), **kw)


# ------------------------------------------------------------------ the recursion itself


def test_gamma_lambda_one_is_return_minus_value():
    r, v = [0.0, 1.0, 0.0, 2.0], [0.5, -1.0, 0.3, 0.7]
    adv, ret = gae_loop(r, v, 0.0, 1.0, 1.0)
    assert adv == pytest.approx([3.0 - 0.5, 3.0 + 1.0, 2.0 - 0.3, 2.0 - 0.7])
    assert ret == pytest.approx([3.0, 3.0, 2.0, 2.0])


def test_lambda_zero_is_the_td_error():
    r, v, g = [0.0, 1.0, 2.0], [0.5, -1.0, 0.3], 0.9
    adv, _ = gae_loop(r, v, 4.0, g, 0.0)
    assert adv == pytest.approx([0.0 + g * -1.0 - 0.5, 1.0 + g * 0.3 + 1.0, 2.0 + g * 4.0 - 0.3])


def test_loop_and_vectorised_agree():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(1, 30)
        r = [rng.gauss(0, 1) for _ in range(n)]
        v = [rng.gauss(0, 1) for _ in range(n)]
        nv, g, lam = rng.gauss(0, 1), rng.random(), rng.random()
        a1, r1 = gae_loop(r, v, nv, g, lam)
        a2, r2 = gae(np.array(r), np.array(v), nv, g, lam)
        assert a2.tolist() == pytest.approx(a1, abs=1e-10)
        assert r2.tolist() == pytest.approx(r1, abs=1e-10)


# ------------------------------------------------------------------ truncation vs termination


@pytest.mark.parametrize("name", ["ppo_token", "ppo_turn", "ppo_bilevel"])
def test_truncation_bootstraps_and_termination_does_not(name):
    est = credit.get_estimator(name)
    values, boot = [[[0.2], [0.4]]], [10.0]
    adv_term = est([TrajectoryGroup("e", 0, [_traj([0.0, 1.0])])], _params(values, boot, gamma=1.0, lam=1.0))
    adv_trunc = est([TrajectoryGroup("e", 0, [_traj([0.0, 1.0], termination=Termination.TRUNCATED_TURNS)])],
                    _params(values, boot, gamma=1.0, lam=1.0))
    first = lambda adv, turn: adv.token_values(0, turn, 1)[0]  # noqa: E731 - every response here is one token
    assert first(adv_term, 1) == pytest.approx(1.0 - 0.4)  # terminal: no future value
    assert first(adv_trunc, 1) == pytest.approx(1.0 + 10.0 - 0.4)  # truncated: bootstraps from V(next)
    # the bootstrap flows back to turn 0 through GAE, except in bi-level where turn 0 ends at V_turn(1)
    assert first(adv_trunc, 0) - first(adv_term, 0) == pytest.approx(0.0 if name == "ppo_bilevel" else 10.0)


# ------------------------------------------------------------------ the three layouts, by hand


def test_token_level_reward_on_last_token_across_turns():
    # two turns of 2 and 1 tokens; rewards 1 and 2; gamma_token = 0.5, lam = 1
    traj = _traj([1.0, 2.0], lengths=[2, 1])
    vals = [[[0.0, 0.0], [0.0]]]
    adv = credit.ppo_token([TrajectoryGroup("e", 0, [traj])], _params(vals, [0.0], gamma_token=0.5, lam=1.0))
    # tokens: r = [0, 1, 2]; returns: [0 + .5*(1 + .5*2), 1 + .5*2, 2] = [1, 2, 2]
    assert adv.tokens == [[pytest.approx([1.0, 2.0]), pytest.approx([2.0])]]
    assert adv.turns == [[pytest.approx(1.5), pytest.approx(2.0)]]  # the per-turn summary is the mean


def test_turn_level_uses_turn_discount_and_first_token_values():
    traj = _traj([0.0, 1.0], lengths=[2, 3])
    vals = [[[0.5, 99.0], [0.25, 99.0, 99.0]]]  # only each turn's first value is read
    adv = credit.ppo_turn([TrajectoryGroup("e", 0, [traj])], _params(vals, [0.0], gamma=0.5, lam=1.0))
    # G = [0.5 * 1, 1]; A = G - V_turn
    assert adv.tokens is None and adv.turns == [[pytest.approx(0.5 - 0.5), pytest.approx(1.0 - 0.25)]]
    targets, mask = credit.ppo_turn.value_targets([TrajectoryGroup("e", 0, [traj])], _params(vals, [0.0], gamma=0.5, lam=1.0))
    assert mask == [[[1, 0], [1, 0, 0]]]
    assert targets[0][0][0] == pytest.approx(0.5) and targets[0][1][0] == pytest.approx(1.0)


def test_bilevel_turn_target_ends_each_turn():
    # turn 0 (2 tokens, r=0), turn 1 (1 token, r=1); gamma (turn) = 0.5, gamma_token = 1, lam = 1
    traj = _traj([0.0, 1.0], lengths=[2, 1])
    vals = [[[0.1, 0.2], [0.8]]]
    adv = credit.ppo_bilevel([TrajectoryGroup("e", 0, [traj])], _params(vals, [0.0], gamma=0.5, gamma_token=1.0, lam=1.0))
    # turn 0 target = 0 + 0.5 * V_turn(1) = 0.4, spread back without discount: A = 0.4 - V
    assert adv.tokens[0][0] == pytest.approx([0.4 - 0.1, 0.4 - 0.2])
    assert adv.tokens[0][1] == pytest.approx([1.0 - 0.8])  # last turn of a terminated episode: r only


def test_whitening_gives_zero_mean_unit_std_over_tokens():
    rng = random.Random(1)
    trajs = [_traj([rng.random() for _ in range(3)], lengths=[2, 1, 3]) for _ in range(4)]
    vals = [[[rng.random() for _ in range(n)] for n in (2, 1, 3)] for _ in trajs]
    adv = credit.ppo_token([TrajectoryGroup("e", 0, trajs)], _params(vals, [0.0] * 4, whiten=True))
    flat = np.array(adv.values())
    assert flat.size == 4 * 6  # one value per response token
    assert abs(flat.mean()) < 1e-9 and flat.std() == pytest.approx(1.0, abs=1e-5)


def test_missing_values_is_an_error_naming_the_fix():
    with pytest.raises(ValueError, match="algo.critic=head"):
        credit.ppo_turn([TrajectoryGroup("e", 0, [_traj([1.0])])], CreditParams())


def test_token_advantages_reach_the_samples():
    traj = _traj([1.0], lengths=[3])
    samples = build_samples([traj], Advantages.per_token([[[0.1, 0.2, 0.3]]]))
    assert samples[0].advantages == [0.0, 0.0, 0.1, 0.2, 0.3]
    with pytest.raises(ValueError, match="3-token response"):
        build_samples([traj], Advantages.per_token([[[0.1, 0.2]]]))


# ------------------------------------------------------------------ GiGPO similarity threshold (algo.gigpo_similarity)


def test_gigpo_similar_anchors_share_a_step_group():
    from turnrl.credit.gigpo import anchor_clusters, anchor_similarity

    def traj(anchors, rewards):
        return Trajectory("e", 0, [Turn([], [1], [0.0], "o", "r", reward=r, anchor=a) for a, r in zip(anchors, rewards)])

    # two FrozenLake-style anchors that differ in one character: ratio = 2 * 22 / 46 ~ 0.957
    a, b = "SFFF/FHFH/FFFH/HFFG@1,2", "SFFF/FHFH/FFFH/HFFG@1,3"
    assert anchor_similarity(a, b) == pytest.approx(44 / 46)
    group = TrajectoryGroup("e", 0, [traj([a, "x"], [0.0, 1.0]), traj([b, "y"], [0.0, 0.0])])
    exact = credit.gigpo([group], CreditParams(norm_std=False, gamma=1.0, similarity=1.0)).turns
    near = credit.gigpo([group], CreditParams(norm_std=False, gamma=1.0, similarity=0.9)).turns
    assert exact == [[0.5, 0.5], [-0.5, -0.5]]  # no shared anchor: episode term only
    assert near == [[1.0, 0.5], [-1.0, -0.5]]  # a ~ b: their returns 1 vs 0 give +-0.5 on the first turn
    assert anchor_clusters([a, b, "zzz", a], 0.9) == [0, 0, 1, 0]
    assert anchor_clusters([a, b, a], 1.0) == [0, 1, 0]
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        anchor_clusters([a], 0.0)


@pytest.mark.parametrize("name", ["ppo_token", "ppo_turn", "reinforce_pp"])
@pytest.mark.parametrize("std, scale", [("population", (2 / 3) ** 0.5), ("unbiased", 1.0)])
def test_whitening_std_population_or_unbiased(name, std, scale):
    # one 1-token turn each, V = 0, gamma = lam = 1: raw advantages (and returns) 1, 0, 2 -> mean 1, deviations 0, -1, 1;
    # population variance 2/3 (OpenRLHF), unbiased variance 2/2 = 1 (TRL's and verl's masked_whiten)
    groups = [TrajectoryGroup("e", 0, [_traj([1.0]), _traj([0.0]), _traj([2.0])])]
    params = _params([[[0.0]]] * 3, [0.0] * 3, whiten=True, whiten_std=std, eps=0.0)
    adv = credit.get_estimator(name)(groups, params)
    assert [a[0] for a in adv.turns] == pytest.approx([0.0, -1 / scale, 1 / scale])


def test_whitening_std_must_be_known():
    groups = [TrajectoryGroup("e", 0, [_traj([1.0]), _traj([0.0])])]
    with pytest.raises(ValueError, match="'population' or 'unbiased'"):
        credit.ppo_turn(groups, _params([[[0.0]]] * 2, [0.0] * 2, whiten=True, whiten_std="sample"))
