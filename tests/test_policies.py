"""Per-role policies (``multiagent.policies=per_role``): each role trains its own weights on its own turns only, a
checkpoint holds every role's weights and optimizer, resume and ``eval --checkpoint`` restore them, and what does
not combine is refused."""

import shutil

import pytest
import torch

from tests.test_resume import _steps, _without_perf
from tests.test_train import TINY
from turnrl.build import build
from turnrl.config import ConfigError, load_config
from turnrl.envs import register, registered
from turnrl.envs.multiagent import MultiAgentEnv, MultiStep
from turnrl.learner import Learner
from turnrl.learner.roles import RoleLearner, merged_metrics
from turnrl.loop import train
from turnrl.monitor.files import read_jsonl
from turnrl.rollout.multiagent import RoleEngines


class RoleParity(MultiAgentEnv):
    """Roles ``a`` then ``b`` answer once each; the one answering is paid 1 for a response of even length, except
    ``still``, which is never paid (its groups' advantages are all zero). Random text gets varied rewards, so a tiny
    random model gets non-zero advantages."""

    roles = ("a", "b")
    role_instructions = {"a": "You are a. Answer.", "b": "You are b. Answer."}

    def __init__(self, still: str = "") -> None:
        self.still, self.seed, self.turn = still, None, 0

    def reset(self, *, seed=None, options=None):
        self.seed, self.turn = seed, 0
        return {role: f"task {seed} for {role}" for role in self.roles}, {}

    def acting(self):
        return self.roles[self.turn : self.turn + 1]

    def step(self, actions):
        (role, text), = actions.items()
        self.turn += 1
        done = self.turn == len(self.roles)
        rewards = {r: float(r == role and r != self.still and len(text) % 2 == 0) for r in self.roles}
        infos = {r: {"success": rewards[r] > 0, "reward_components": {"outcome": rewards[r]}} for r in self.roles}
        infos[role].update(actions=[text], valid=True)
        observations = {} if done else {r: f"turn {self.turn}" for r in self.roles}
        return MultiStep(observations, rewards, dict.fromkeys(self.roles, done), dict.fromkeys(self.roles, False), infos)

    def anchor(self, role):
        return str(self.turn)

    def task_key(self):
        return f"role-parity:{self.seed}"


if "role-parity-v0" not in registered():
    register("role-parity-v0", RoleParity, description="test env: two roles paid for even-length answers")

PER_ROLE = ["env.id=role-parity-v0", "multiagent.policies=per_role", "rollout.group_size=4", "eval.every=0",
            "eval.at_start=false", "log.checkpoint_every=1", "log.keep_checkpoints=3"]


def _cfg(tmp_path, name, *overrides):
    return load_config(None, TINY + PER_ROLE + [f"log.run_dir={tmp_path}", f"log.name={name}", *overrides])


def _build(cfg, tokenizer):
    from turnrl.models import tiny_model

    return build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)


def _weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tokenizer):
    """A 2-step per-role run: its directory, its components, and the roles' weights before training."""
    root = tmp_path_factory.mktemp("per-role")
    cfg = _cfg(root, "full")
    c = _build(cfg, tokenizer)
    start = {role: _weights(m) for role, m in c.model.items()}
    return train(cfg, components=c), c, start


def test_each_role_has_its_own_weights_engine_and_optimizer_and_both_move(trained):
    run, c, start = trained
    a, b = c.model["a"], c.model["b"]
    assert isinstance(c.learner, RoleLearner) and isinstance(c.engine, RoleEngines)
    assert c.learner.learners["a"].model is a and c.learner.learners["b"].model is b
    assert c.engine.engines["a"] is not c.engine.engines["b"] and c.engine.version == 2
    assert not {id(p) for p in a.parameters()} & {id(p) for p in b.parameters()}
    now = {role: _weights(m) for role, m in c.model.items()}
    assert not _same(now["a"], start["a"]) and not _same(now["b"], start["b"]) and not _same(now["a"], now["b"])
    last = read_jsonl(run / "metrics.jsonl")[-1]
    for role in ("a", "b"):
        assert last[f"train/num_samples/{role}"] > 0 and last[f"train/grad_norm/{role}"] > 0 and f"train/loss/{role}" in last
        assert 0 <= last[f"rollout/success_rate/{role}"] <= 1 and f"eval/return/{role}" in last
    assert last["train/num_samples"] == last["train/num_samples/a"] + last["train/num_samples/b"]
    assert last["train/grad_norm"] == max(last["train/grad_norm/a"], last["train/grad_norm/b"])


def test_a_role_whose_advantages_are_all_zero_keeps_its_weights(tmp_path, tokenizer):
    cfg = _cfg(tmp_path, "still", "env.kwargs.still=b", "train.steps=1", "algo.skip_zero_advantage=false")
    c = _build(cfg, tokenizer)
    start = {role: _weights(m) for role, m in c.model.items()}
    run = train(cfg, components=c)
    last = read_jsonl(run / "metrics.jsonl")[-1]
    assert last["train/num_samples/b"] > 0 and last["train/grad_norm/b"] == 0.0  # b trained on its own samples only
    assert _same(_weights(c.model["b"]), start["b"]) and not _same(_weights(c.model["a"]), start["a"])


def test_a_resumed_per_role_run_continues_exactly(trained, tmp_path, tokenizer):
    full, c_full, _ = trained
    ckpt = full / "checkpoints" / "step_000002"
    assert (ckpt / "model" / "model.safetensors").is_file() and (ckpt / "roles" / "b" / "model.safetensors").is_file()
    cfg = _cfg(tmp_path, "split")
    split = train(cfg, components=_build(cfg, tokenizer))
    shutil.rmtree(split / "checkpoints" / "step_000002")  # killed before its step-2 checkpoint
    (split / "checkpoints" / "latest").write_text("step_000001")
    c = _build(cfg, tokenizer)
    train(cfg, resume=split, components=c)
    assert _steps(tmp_path / "split") == _steps(full) == [1, 2]
    assert _without_perf(read_jsonl(tmp_path / "split" / "metrics.jsonl")) == _without_perf(read_jsonl(full / "metrics.jsonl"))
    for role in ("a", "b"):
        assert _same(_weights(c.model[role]), _weights(c_full.model[role]))
        mine, theirs = c.learner.learners[role].optimizer.state_dict(), c_full.learner.learners[role].optimizer.state_dict()
        assert all(torch.equal(mine["state"][i]["exp_avg"], theirs["state"][i]["exp_avg"]) for i in theirs["state"])


def test_eval_from_a_per_role_checkpoint_plays_each_role_with_its_own_weights(trained, tokenizer):
    import turnrl

    run, c_full, _ = trained
    cfg = load_config(run / "config.yaml", [f"model.path={run / 'checkpoints' / 'step_000002' / 'model'}"])
    c = build(cfg, tokenizer=tokenizer)  # the checkpoint's model directory, as `turnrl eval --checkpoint` loads it
    for role in ("a", "b"):
        assert _same(_weights(c.model[role]), _weights(c_full.model[role]))
    result = turnrl.evaluate(checkpoint=run)  # greedy, on the run's held-out tasks: what its last evaluation measured
    last = read_jsonl(run / "metrics.jsonl")[-1]
    assert {k: v for k, v in result.metrics.items() if k.startswith("eval/")} == {k: v for k, v in last.items() if k.startswith("eval/")}
    assert "eval/return/b" in result.metrics and result.distinct_tasks == 2


def _two_role_rollouts(tokenizer):
    """Two differently initialised tiny models, one recording engine each, and 2 tasks x 2 episodes they played."""
    from tests.test_rollout import RecordingEngine  # an HF engine that keeps every (prompt, response) it generated
    from turnrl.engines import SamplingParams
    from turnrl.envs import make
    from turnrl.models import tiny_model
    from turnrl.rollout.multiagent import MultiAgentCollector

    engines = {role: RecordingEngine(tiny_model(tokenizer, seed=seed), tokenizer, seed=0) for role, seed in (("a", 1), ("b", 2))}
    collector = MultiAgentCollector(RoleEngines(engines), tokenizer, lambda: make("role-parity-v0"))
    return engines, [t for g in collector.collect([1, 2], 2, SamplingParams(max_new_tokens=4)) for t in g.trajectories]


def test_each_role_is_played_and_recorded_by_its_own_engine(tokenizer):
    engines, trajs = _two_role_rollouts(tokenizer)
    assert [t.agent for t in trajs] == ["a", "a", "b", "b"] * 2
    for t in trajs:
        other = engines["b" if t.agent == "a" else "a"]
        for turn in t.turns:  # per_step: a turn's prompt is the whole prompt its role's engine conditioned on
            assert (turn.prompt_ids, turn.response_ids) in engines[t.agent].seen
            assert (turn.prompt_ids, turn.response_ids) not in other.seen
    assert all(len(e.seen) == sum(t.num_turns for t in trajs if t.agent == role) for role, e in engines.items())


def test_the_kl_to_the_reference_is_each_roles_own(tokenizer):
    from turnrl.learner import LearnerParams
    from turnrl.models import frozen_copy

    engines, trajs = _two_role_rollouts(tokenizer)
    params = LearnerParams.from_config(load_config(None, TINY))
    learners = {role: Learner(e.model, params, tokenizer.pad_token_id, ref_model=frozen_copy(e.model)) for role, e in engines.items()}
    routed = RoleLearner(learners).reference_turn_kl(trajs)
    for t, kl in zip(trajs, routed):  # each role's reference is its own starting weights: KL ~ 0 against it
        assert kl == pytest.approx(learners[t.agent].reference_turn_kl([t])[0], abs=1e-5) and all(abs(x) < 1e-4 for x in kl)


def test_merged_metrics_sum_counts_take_extremes_and_weight_means_by_tokens():
    merged = merged_metrics({
        "a": {"train/loss": 1.0, "train/num_tokens": 30.0, "train/entropy": 2.0, "train/grad_norm": 0.5,
              "train/ratio_max": 1.2, "train/is_ratio_min": 0.9},
        "b": {"train/loss": 3.0, "train/num_tokens": 10.0, "train/entropy": 6.0, "train/grad_norm": 1.5,
              "train/ratio_max": 1.1, "train/is_ratio_min": 0.7},
        "c": {"train/num_samples": 0.0},  # a role with nothing to train on
    })
    assert merged["train/loss"] == 4.0 and merged["train/num_tokens"] == 40.0 and merged["train/entropy"] == 3.0
    assert merged["train/grad_norm"] == 1.5 and merged["train/ratio_max"] == 1.2 and merged["train/is_ratio_min"] == 0.7
    assert merged["train/entropy/b"] == 6.0 and merged["train/num_samples/c"] == 0.0 and merged["train/num_samples"] == 0.0


@pytest.mark.parametrize("override, fix", [
    ("multiagent.selfplay=true", "multiagent.selfplay=false"),
    ("scale.async_mode=true", "scale.async_mode=false"),
    ("scale.learner_ranks=2", "scale.learner_ranks=1"),
    ("algo.critic=head algo.estimator=ppo_turn", "algo.critic=none"),
    ("scale.workers=1", "scale.workers=0"),
    ("env.id=parity-v0", "multi-agent env"),
])
@pytest.mark.probe("bad_input")
def test_what_per_role_policies_do_not_combine_with_is_refused(tmp_path, tokenizer, override, fix):
    with pytest.raises(ConfigError, match=fix) as e:
        _build(_cfg(tmp_path, "refused", *override.split()), tokenizer)
    assert "multiagent.policies=shared" in str(e.value) and "\n" not in str(e.value)


def test_shared_policies_build_one_model_engine_and_learner_as_before(tmp_path, tokenizer, tiny_model):
    cfg = _cfg(tmp_path, "shared", "multiagent.policies=shared")
    c = build(cfg, model=tiny_model, tokenizer=tokenizer)
    assert c.model is tiny_model and type(c.learner) is Learner and c.learner.model is tiny_model
    assert not isinstance(c.engine, RoleEngines) and c.collector.engine is c.engine


def test_activation_checkpointing_applies_to_every_roles_model(tmp_path, tokenizer):
    from turnrl.models.recompute import is_checkpointed

    c = _build(_cfg(tmp_path, "recompute", "train.activation_checkpointing=true"), tokenizer)
    assert len(c.model) == 2 and all(is_checkpointed(m) for m in c.model.values())


@pytest.mark.probe("bad_input")
def test_sft_refuses_per_role_policies(tmp_path):
    from turnrl.sft import sft

    with pytest.raises(ConfigError, match="multiagent.policies=shared"):
        sft(_cfg(tmp_path, "sft"))
