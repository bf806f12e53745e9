"""The learned critic: position convention, clipped value loss, joint/separate training, PPO smoke run."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from turnrl import credit
from turnrl.config import Config, ConfigError, load_config
from turnrl.credit import CreditParams
from turnrl.learner import Critic, CriticParams, Learner, LearnerParams, ValueBatch, build_samples, losses
from turnrl.types import Termination, Trajectory, TrajectoryGroup, Turn


def _batch(seed: int = 0) -> list[TrajectoryGroup]:
    rng = random.Random(seed)
    groups = []
    for g in range(2):
        trajs = []
        for i in range(3):
            turns = []
            for t in range(2):
                resp = [rng.randint(10, 500) for _ in range(3)]
                turns.append(Turn(prompt_ids=[1, 2, rng.randint(10, 500), 4 + t], response_ids=resp, logprobs=[-1.0] * 3, observation="o",
                                  response_text="r", reward=float(rng.random() < 0.5)))
            term = Termination.TERMINATED if i else Termination.TRUNCATED_TURNS
            trajs.append(Trajectory("e", g, turns, termination=term, context="full" if (g and i == 2) else "per_step"))
        groups.append(TrajectoryGroup("e", g, trajs))
    return groups


def _cfg(**algo) -> Config:
    algo = {"estimator": "ppo_turn", "critic": "head", "critic_lr": 1e-2, **algo}
    return load_config(overrides=[f"algo.{k}={v}" for k, v in algo.items()] + ["model.autocast_bf16=false"])


# ------------------------------------------------------------------ the value loss


def test_clipped_value_loss_gradient_is_zero_where_the_clip_is_active():
    old = torch.tensor([0.0, 0.0, 0.0, 0.0])
    ret = torch.tensor([1.0, -1.0, 1.0, 0.05])
    v = torch.tensor([0.5, -0.5, 0.1, 0.5], requires_grad=True)
    loss, stats = losses.clipped_value_loss(v, old, ret, torch.ones(4), clip=0.2)
    loss.sum().backward()
    # rows 0 and 1 moved > 0.2 from V_old towards R: the clipped branch is the larger one, constant in V -> no gradient
    assert v.grad[0] == 0 and v.grad[1] == 0
    assert v.grad[2] == pytest.approx(0.1 - 1.0)  # inside the clip: d/dV 0.5 (V - R)^2
    assert v.grad[3] == pytest.approx(0.5 - 0.05)  # outside the clip but the unclipped error is larger
    assert stats["value_clip_frac"] == pytest.approx(0.5)
    loss0, _ = losses.clipped_value_loss(v, old, ret, torch.ones(4), clip=0.0)
    assert loss0.tolist() == pytest.approx((0.5 * (v.detach() - ret) ** 2).tolist())


# ------------------------------------------------------------------ positions and modes


def test_head_leaves_policy_outputs_unchanged_and_reads_the_position_before_each_token(tiny_model, tokenizer):
    ids = torch.tensor([[1, 2, 3, 40, 41]])
    before = tiny_model(input_ids=ids).logits.detach().clone()
    critic = Critic(tiny_model, CriticParams("head", lr=1e-3, value_clip=0.2, grad_clip=1.0), tokenizer.pad_token_id)
    torch.nn.init.normal_(critic.head.weight)
    assert torch.equal(tiny_model(input_ids=ids).logits, before)
    traj = Trajectory("e", 0, [Turn([1, 2, 3], [40, 41], [-1.0, -1.0], "o", "r")], termination=Termination.TRUNCATED_TURNS)
    vals = critic.predict([traj])
    with torch.no_grad():
        h = tiny_model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        expect = critic.head(h).squeeze(-1)[0]
    assert vals.token_values[0][0] == pytest.approx(expect[[2, 3]].tolist(), abs=1e-5)  # before tokens 40 and 41
    assert vals.bootstrap[0] == pytest.approx(float(expect[4]), abs=1e-5)  # after the last token


def test_per_step_and_full_layouts_give_the_same_values_for_the_same_tokens(tiny_model, tokenizer):
    critic = Critic(tiny_model, CriticParams("head", lr=1e-3, value_clip=0.2, grad_clip=1.0), tokenizer.pad_token_id)
    torch.nn.init.normal_(critic.head.weight)
    turns = [Turn([1, 2], [30, 31], [-1.0] * 2, "o", "r"), Turn([5], [32], [-1.0], "o", "r")]
    full = Trajectory("e", 0, turns, context="full")
    # per_step with the whole history as each turn's prompt sees the same prefixes
    step = Trajectory("e", 0, [Turn([1, 2], [30, 31], [-1.0] * 2, "o", "r"), Turn([1, 2, 30, 31, 5], [32], [-1.0], "o", "r")])
    a, b = critic.predict([full]), critic.predict([step])
    for x, y in zip(a.token_values[0], b.token_values[0]):
        assert x == pytest.approx(y, abs=1e-4)
    assert a.bootstrap == pytest.approx(b.bootstrap, abs=1e-4)


@pytest.mark.parametrize("mode", ["head", "separate"])
def test_shared_prefix_pass_gives_the_values_and_gradients_of_full_sequences(tiny_model, tokenizer, mode):
    """The prompt prefix shared by a chunk runs once; values and value-loss gradients equal the unshared pass."""
    torch.manual_seed(0)
    rng = random.Random(1)
    system = [rng.randint(10, 500) for _ in range(24)]  # long enough to be shared (>= min_shared_prefix)
    trajs = []
    for i in range(5):
        turns = [Turn(system + [rng.randint(10, 500) for _ in range(2 + i % 3)], [rng.randint(10, 500) for _ in range(1 + t)],
                      [-1.0] * (1 + t), "o", "r", reward=float(t)) for t in range(2)]
        trajs.append(Trajectory("e", 0, turns, termination=Termination.TRUNCATED_TURNS))
    params = CriticParams(mode, lr=1e-3, value_clip=0.2, grad_clip=1.0)
    shared = Critic(tiny_model, params, tokenizer.pad_token_id)
    plain = Critic(tiny_model, dataclasses.replace(params, min_shared_prefix=10**9), tokenizer.pad_token_id)
    torch.nn.init.normal_(shared.head.weight)
    plain.head.load_state_dict(shared.head.state_dict())
    if mode == "separate":
        plain.trunk.load_state_dict(shared.trunk.state_dict())
    a, b = shared.predict(trajs), plain.predict(trajs)
    for x, y in zip(a.token_values, b.token_values):
        for u, w in zip(x, y):
            assert u == pytest.approx(w, abs=1e-4)
    assert a.bootstrap == pytest.approx(b.bootstrap, abs=1e-4)
    batch = ValueBatch(trajs, returns=[[[1.0] * len(t.response_ids) for t in tr.turns] for tr in trajs],
                       mask=[[[1] * len(t.response_ids) for t in tr.turns] for tr in trajs], old_values=a.token_values)
    grads = []
    for c in (shared, plain):
        c.zero_grad()
        tiny_model.zero_grad(set_to_none=True)
        c.backward_value_loss(batch, 1.0)
        grads.append(torch.cat([p.grad.flatten() for p in [*c.head.parameters(), *c.trunk.parameters()] if p.grad is not None]))
    assert grads[0].abs().max() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-3)


def test_config_ties_critic_and_gae_estimators_together():
    with pytest.raises(ConfigError, match="needs a learned critic"):
        load_config(overrides=["algo.estimator=ppo_turn"])
    with pytest.raises(ConfigError, match="only used by the GAE estimators"):
        load_config(overrides=["algo.critic=head"])
    assert Config().algo.critic == "none"


@pytest.mark.parametrize("mode", ["head", "separate"])
def test_value_loss_goes_down_on_a_fixed_batch(tiny_model, tokenizer, mode):
    """PPO smoke run: a few updates on one batch; the value error falls and the policy still trains."""
    torch.manual_seed(0)
    cfg = _cfg(critic=mode, value_clip=1.0, critic_lr=1e-2 if mode == "head" else 3e-3)
    critic = Critic(tiny_model, CriticParams.from_config(cfg), tokenizer.pad_token_id)
    learner = Learner(tiny_model, LearnerParams.from_config(cfg), pad_id=tokenizer.pad_token_id, critic=critic)
    groups = _batch()[1:]  # one group: a truncated, a terminated and a full-context trajectory
    trajs = [t for g in groups for t in g.trajectories]
    est = credit.get_estimator(cfg.algo.estimator)
    policy_before = [p.detach().clone() for p in tiny_model.parameters()]
    errors = []
    for _ in range(8):
        params = CreditParams(gamma=cfg.algo.gamma, lam=cfg.algo.lam, values=critic.predict(trajs))
        adv = est(groups, params)
        returns, mask = est.value_targets(groups, params)
        m = learner.update(build_samples(trajs, adv), ValueBatch(trajs, returns, mask, params.values.token_values))
        errors.append(m["train/value_error"])
    assert errors[-1] < 0.6 * errors[0], errors
    changed = any(not torch.equal(a, b) for a, b in zip(policy_before, tiny_model.parameters()))
    assert changed  # the policy was updated too (and, in head mode, its trunk by the value loss)
    head_before = critic.head.weight.detach().clone()
    m = learner.update([], ValueBatch(trajs, returns, mask, params.values.token_values))  # no policy samples left
    assert m["train/value_loss"] > 0 and not torch.equal(head_before, critic.head.weight)
    state = learner.state_dict()
    assert state["critic"]["mode"] == mode
    other = Critic(tiny_model, CriticParams(mode, lr=1e-3, value_clip=0.2, grad_clip=1.0), tokenizer.pad_token_id)
    other.load_state_dict(state["critic"])
    assert torch.equal(other.head.weight, critic.head.weight)


# ------------------------------------------------------------------ the training loop with a critic


@pytest.mark.parametrize("estimator", ["ppo_turn", "ppo_token", "ppo_bilevel"])
def test_smoke_run_with_a_critic_checkpoints_and_resumes(tmp_path, tokenizer, estimator):
    from tests.test_train import _run
    from turnrl.monitor.sinks import read_metrics

    common = [f"algo.estimator={estimator}", "algo.critic=head", "eval.every=0", "eval.at_start=false", "log.checkpoint_every=1"]
    run_dir, c = _run(tmp_path, tokenizer, common, "ppo", steps=1)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows[-1]["train/value_loss"] > 0 and "train/value_error" in rows[-1]
    head = c.learner.critic.head.weight.detach().clone()
    assert head.abs().sum() > 0  # the zero-initialised head was trained
    _, resumed = _run(tmp_path, tokenizer, common, "ppo", resume=True)  # to step 2, from the step-1 checkpoint
    assert resumed.learner.critic is not None and rows[-1]["step"] == 1


def test_smoke_run_with_kl_in_reward_and_running_reward_norm(tmp_path, tokenizer):
    from tests.test_train import _run
    from turnrl.monitor.sinks import read_metrics

    run_dir, c = _run(tmp_path, tokenizer, ["model.reference=true", "algo.kl_in_reward=0.1", "algo.kl_target=0.01",
                                            "algo.reward_norm=running", "eval.every=0", "eval.at_start=false"], "klr")
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert "rollout/reward/kl" in rows[-1] and "rollout/reward/norm" in rows[-1]
    assert rows[-1]["train/kl_reward_beta"] != 0.1  # the adaptive controller moved beta after step 1
    state = torch.load(run_dir / "checkpoints" / "step_000002" / "state.pt", weights_only=False)
    assert state["reward_shaper"]["norm"]["count"] == 2 * 2 * 2 * 2  # steps x tasks x copies x turns
