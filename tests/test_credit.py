"""Advantage estimators: hand-computed values, edge cases, loop vs vectorised, permutation invariance."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from turnrl import credit
from turnrl.credit import (
    CreditParams,
    ValueInputs,
    available_estimators,
    episode_rewards,
    estimator_flag,
    get_estimator,
    register_estimator,
)
from turnrl.types import Termination, Trajectory, TrajectoryGroup, Turn

GRPO = CreditParams()
DR_GRPO = CreditParams(norm_std=False)


def _turn(reward: float) -> Turn:
    return Turn(prompt_ids=[1], response_ids=[2], logprobs=[-0.1], observation="o", response_text="r", reward=reward)


def _traj(turn_rewards: list[float], seed: int = 0) -> Trajectory:
    return Trajectory(env_id="e", seed=seed, turns=[_turn(r) for r in turn_rewards])


def _group(episode_rewards_: list[float], turns: int = 1, seed: int = 0) -> TrajectoryGroup:
    """One trajectory per reward; the reward is paid on the last of ``turns`` turns."""
    trajs = [_traj([0.0] * (turns - 1) + [r], seed) for r in episode_rewards_]
    return TrajectoryGroup(env_id="e", seed=seed, trajectories=trajs)


def _approx(xs, rel=1e-5, abs_=1e-6):
    return pytest.approx(xs, rel=rel, abs=abs_)


# ------------------------------------------------------------------ hand-computed values
# Group rewards [0, 1, 2, 5]: mean 2, deviations [-2, -1, 0, 3], sum of squares 14,
# sample variance 14/3, sample std sqrt(14/3) = 2.1602468994692865.


def test_grpo_normalised_hand_values():
    adv = credit.grpo([_group([0, 1, 2, 5])], GRPO)
    expected = [-0.9258200997725514, -0.4629100498862757, 0.0, 1.3887301496588271]  # dev / sqrt(14/3)
    assert [a[0] for a in adv.turns] == _approx(expected)


def test_grpo_two_copies_uses_sample_std():
    # {0, 1}: mean 0.5, sample std sqrt(0.5) = 0.70710678 -> A = -/+0.5 / 0.70710678 = -/+0.70710678
    adv = credit.grpo([_group([0, 1])], GRPO)
    assert [a[0] for a in adv.turns] == _approx([-0.7071067811865475, 0.7071067811865475])


def test_dr_grpo_is_centred_only():
    adv = credit.grpo([_group([0, 1, 2, 5])], DR_GRPO)
    assert [a[0] for a in adv.turns] == _approx([-2.0, -1.0, 0.0, 3.0])


def test_rloo_hand_values():
    # R_i - mean of the other three: 0 - 8/3, 1 - 7/3, 2 - 2, 5 - 1
    adv = credit.rloo([_group([0, 1, 2, 5])], GRPO)
    assert [a[0] for a in adv.turns] == _approx([-8 / 3, -4 / 3, 0.0, 4.0])
    adv2 = credit.rloo([_group([0, 1])], GRPO).turns
    assert [a[0] for a in adv2] == _approx([-1.0, 1.0])


def test_every_turn_gets_the_trajectory_advantage_and_order_is_flattened():
    g1 = TrajectoryGroup("e", 0, [_traj([0.0, 0.0, 1.0]), _traj([0.0])])  # rewards 1, 0
    g2 = TrajectoryGroup("e", 1, [_traj([]), _traj([2.0, 2.0])])  # rewards 0, 4 (empty trajectory)
    adv = credit.grpo([g1, g2], DR_GRPO)
    assert adv.turns == [[0.5, 0.5, 0.5], [-0.5], [], [2.0, 2.0]]
    assert episode_rewards([g1, g2]) == [[1.0, 0.0], [0.0, 4.0]]


@pytest.mark.parametrize("name", ["grpo", "rloo", "grpo_turn"])
@pytest.mark.parametrize("params", [GRPO, DR_GRPO])
def test_singleton_and_zero_variance_groups_are_exactly_zero(name, params):
    est = get_estimator(name)
    groups = [_group([3.0], turns=2), _group([0.1, 0.1, 0.1], turns=2), _group([0.0, 1.0])]
    adv = est(groups, params)
    assert adv.turns[0] == [0.0, 0.0]
    assert adv.turns[1:4] == [[0.0, 0.0]] * 3  # exact zeros (0.1 * 3 / 3 != 0.1 in floats)
    assert adv.turns[4][0] < 0 < adv.turns[5][0]


def test_empty_batch():
    for name in available_estimators():
        assert get_estimator(name)([], GRPO).turns == []


def test_non_finite_reward_is_an_error():
    with pytest.raises(ValueError, match="non-finite"):
        credit.grpo([_group([1.0, float("nan")])], GRPO)


# ------------------------------------------------------------------ loop vs vectorised, permutation


def _random_groups(rng: random.Random, n_groups: int = 7) -> list[TrajectoryGroup]:
    groups = []
    for gi in range(n_groups):
        k = rng.randint(1, 6)
        trajs = [_traj([rng.choice([0.0, 0.0, 0.5, 1.0, -0.2]) for _ in range(rng.randint(0, 4))], gi) for _ in range(k)]
        groups.append(TrajectoryGroup("e", gi, trajs))
    return groups


def _loop_grpo(groups, params):
    out = []
    for g in groups:
        rs = [sum(t.reward for t in tr.turns) for tr in g.trajectories]
        for tr, r in zip(g.trajectories, rs):
            if len(rs) < 2 or max(rs) == min(rs):
                a = 0.0
            elif params.norm_std:
                a = (r - statistics.fmean(rs)) / (statistics.stdev(rs) + params.eps)
            else:
                a = r - statistics.fmean(rs)
            out.append([a] * len(tr.turns))
    return out


def _loop_rloo(groups, params):
    out = []
    for g in groups:
        rs = [sum(t.reward for t in tr.turns) for tr in g.trajectories]
        for i, tr in enumerate(g.trajectories):
            others = rs[:i] + rs[i + 1 :]
            a = 0.0 if not others or max(rs) == min(rs) else rs[i] - sum(others) / len(others)
            out.append([a] * len(tr.turns))
    return out


@pytest.mark.parametrize("params", [GRPO, DR_GRPO])
def test_vectorised_matches_loop(params):
    rng = random.Random(0)
    for _ in range(20):
        groups = _random_groups(rng)
        for fn, ref in ((credit.grpo, _loop_grpo), (credit.rloo, _loop_rloo)):
            got, want = fn(groups, params).turns, ref(groups, params)
            assert [len(a) for a in got] == [len(a) for a in want]
            for a, b in zip(got, want):
                assert a == _approx(b, rel=1e-9, abs_=1e-12)


def test_rloo_equals_scaled_dr_grpo():
    rng = random.Random(1)
    groups = [g for g in _random_groups(rng, 12) if len(g.trajectories) > 1]
    r, d = credit.rloo(groups, GRPO).turns, credit.grpo(groups, DR_GRPO).turns
    ks = [len(g.trajectories) for g in groups for _ in g.trajectories]
    for k, a, b in zip(ks, r, d):
        assert a == _approx([k / (k - 1) * x for x in b], rel=1e-9, abs_=1e-12)


@pytest.mark.parametrize("name", ["grpo", "rloo", "grpo_turn"])
def test_permuting_groups_and_trajectories_permutes_the_output(name):
    est = get_estimator(name)
    rng = random.Random(2)
    params = CreditParams(gamma=0.9)
    groups = _random_groups(rng, 8)
    base = {id(t): a for t, a in zip([t for g in groups for t in g.trajectories], est(groups, params).turns)}
    for _ in range(5):
        shuffled = [TrajectoryGroup(g.env_id, g.seed, rng.sample(g.trajectories, len(g.trajectories))) for g in groups]
        rng.shuffle(shuffled)
        out = est(shuffled, params).turns
        flat = [t for g in shuffled for t in g.trajectories]
        assert len(out) == len(flat)
        for t, a in zip(flat, out):
            assert a == _approx(base[id(t)], rel=1e-12, abs_=1e-12)


# ------------------------------------------------------------------ grpo_turn


def test_turn_returns():
    # gamma 0.5: G2 = 3, G1 = 2 + 0.5*3 = 3.5, G0 = 1 + 0.5*3.5 = 2.75
    assert credit.turn_returns([1.0, 2.0, 3.0], 0.5) == [2.75, 3.5, 3.0]
    assert credit.turn_returns([], 0.5) == []


def test_grpo_turn_hand_values():
    # A: rewards [0, 1], gamma 0.5 -> returns [0.5, 1]; B: [0, 0, 0] -> [0, 0, 0]
    # pool [0.5, 1, 0, 0, 0]: mean 0.3, deviations [0.2, 0.7, -0.3 x3], sum sq 0.8, sample var 0.2, std 0.4472136
    g = TrajectoryGroup("e", 0, [_traj([0.0, 1.0]), _traj([0.0, 0.0, 0.0])])
    adv = credit.grpo_turn([g], CreditParams(gamma=0.5))
    assert adv.turns[0] == _approx([0.4472135955, 1.5652475842])
    assert adv.turns[1] == _approx([-0.6708203932] * 3)
    adv = credit.grpo_turn([g], CreditParams(gamma=0.5, norm_std=False))
    assert adv.turns[0] == _approx([0.2, 0.7]) and adv.turns[1] == _approx([-0.3] * 3)


def test_grpo_turn_equals_dr_grpo_for_outcome_rewards_of_equal_length():
    rng = random.Random(3)
    groups = [_group([rng.choice([0.0, 1.0, 0.5]) for _ in range(rng.randint(1, 5))], turns=3, seed=i) for i in range(6)]
    a, b = credit.grpo_turn(groups, DR_GRPO).turns, credit.grpo(groups, DR_GRPO).turns
    for x, y in zip(a, b):
        assert x == _approx(y, rel=1e-12, abs_=1e-12)


# ------------------------------------------------------------------ registry


def test_registry():
    assert {"grpo", "rloo", "grpo_turn"} <= set(available_estimators())
    assert available_estimators() == sorted(available_estimators())
    assert get_estimator("grpo") is credit.grpo
    with pytest.raises(ValueError, match=r"Did you mean 'grpo'\?.*rloo"):
        get_estimator("gpro")
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("grpo")(lambda groups, params: [])


def test_register_custom_estimator():
    from turnrl.credit import base

    @register_estimator("test-constant")
    def constant(groups, params):
        return [[1.0] * t.num_turns for g in groups for t in g.trajectories]

    try:
        assert get_estimator("test-constant")([_group([0.0, 1.0], turns=2)], GRPO) == [[1.0, 1.0], [1.0, 1.0]]
    finally:
        del base._REGISTRY["test-constant"]


def test_params_are_frozen():
    with pytest.raises(Exception):
        GRPO.eps = 1.0  # type: ignore[misc]
    assert math.isclose(CreditParams().eps, 1e-6)


# ------------------------------------------------------------------ env errors never enter the statistics


def _err_turn(t: int, reward: float, n_tokens: int) -> Turn:
    return Turn(prompt_ids=[1], response_ids=[2] * n_tokens, logprobs=[-0.1] * n_tokens, observation="o",
                response_text="r", reward=reward, anchor=f"s{t}")


def _err_traj(uid: int, rewards: list[float], termination: Termination = Termination.TERMINATED) -> Trajectory:
    """Trajectory ``uid`` (its seed): turn t pays ``rewards[t]``, has 1 + (uid + t) % 3 response tokens, anchor s<t>."""
    turns = [_err_turn(t, r, 1 + (uid + t) % 3) for t, r in enumerate(rewards)]
    return Trajectory(env_id="e", seed=uid, turns=turns, termination=termination)


def _err_params(est, groups: list[TrajectoryGroup]) -> CreditParams:
    """Params every estimator can run on; critic values and greedy baselines are functions of the trajectory or group."""
    trajs = [t for g in groups for t in g.trajectories]
    values = ValueInputs([[[0.1 * t.seed + 0.05 * j - 0.02 * k for k in range(len(turn.response_ids))]
                           for j, turn in enumerate(t.turns)] for t in trajs], [0.3 * t.seed for t in trajs])
    return CreditParams(gamma=0.9, values=values if estimator_flag(est, "needs_critic") else None,
                        baseline_rewards=tuple(0.25 * g.seed for g in groups))


def _err_groups(with_errors: bool) -> list[TrajectoryGroup]:
    """Three groups of varied trajectories; with errors, env-error trajectories (huge rewards, shared anchors,
    response tokens) join group 0 and group 2, which without them is a singleton, and fill a fourth group."""
    rng = random.Random(7)
    good = [[_err_traj(10 * gi + k, [rng.choice([0.0, 0.5, 1.0, -0.2]) for _ in range(rng.randint(1, 3))])
             for k in range(3 if gi < 2 else 1)] for gi in range(3)]
    if with_errors:
        good[0].insert(1, _err_traj(90, [7.0, 7.0], Termination.ENV_ERROR))
        good[2].append(_err_traj(91, [-5.0, 3.0], Termination.ENV_ERROR))
        good.append([_err_traj(92, [4.0, 0.0], Termination.ENV_ERROR), _err_traj(93, [0.0, 0.0], Termination.ENV_ERROR)])
    return [TrajectoryGroup("e", gi, trajs) for gi, trajs in enumerate(good)]


@pytest.mark.parametrize("name", available_estimators())
def test_env_error_trajectories_leave_every_other_advantage_unchanged_and_get_zero(name):
    est = get_estimator(name)
    clean, dirty = _err_groups(False), _err_groups(True)
    if name in ("team_grpo", "counterfactual"):  # team credit reads each episode's team return (multi-agent envs)
        for t in (t for g in clean + dirty for t in g.trajectories):
            t.team_return = t.total_reward
    before, after = est(clean, _err_params(est, clean)), est(dirty, _err_params(est, dirty))
    flat = [t for g in dirty for t in g.trajectories]
    errors = [i for i, t in enumerate(flat) if t.termination == Termination.ENV_ERROR]
    kept = [i for i in range(len(flat)) if i not in errors]
    assert [len(after.turns[i]) for i in kept] == [len(a) for a in before.turns]
    assert [a for i in kept for a in after.turns[i]] == _approx([a for traj in before.turns for a in traj], rel=1e-12, abs_=1e-12)
    assert [after.turns[i] for i in errors] == [[0.0, 0.0]] * 4
    if before.tokens is not None:
        assert [x for i in kept for turn in after.tokens[i] for x in turn] == _approx(
            [x for traj in before.tokens for turn in traj for x in turn], rel=1e-12, abs_=1e-12)
        assert all(x == 0.0 for i in errors for turn in after.tokens[i] for x in turn)
    if name in ("grpo", "rloo", "grpo_turn", "gigpo"):  # group 2 is a singleton with or without its env error
        assert before.turns[-1] == [0.0] * len(before.turns[-1])


def test_group_counts_exclude_env_errors_first():
    err = Termination.ENV_ERROR
    groups = [
        TrajectoryGroup("e", 0, [_err_traj(0, [1.0]), _err_traj(1, [0.0])]),
        TrajectoryGroup("e", 1, [_err_traj(2, [1.0]), _err_traj(3, [0.0], err)]),  # a singleton once the error is out
        TrajectoryGroup("e", 2, [_err_traj(4, [1.0], err), _err_traj(5, [0.0], err)]),  # nothing left: not a singleton
        TrajectoryGroup("e", 3, [_err_traj(6, [1.0])]),
    ]
    assert credit.group_counts(groups) == credit.GroupCounts(singleton_groups=2, env_error_trajectories=3)
    assert credit.group_counts([]) == credit.GroupCounts(singleton_groups=0, env_error_trajectories=0)
