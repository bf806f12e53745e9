"""The sharded learner (turnrl.scale.sharded, scale.learner_sharding=fsdp): FSDP2 on 2 gloo ranks gives the
single-process update, update after update and PPO epoch after epoch; each rank holds half of the optimizer state;
a checkpoint's state resumes it exactly; what it does not support is refused with the fix."""

import copy
import dataclasses

import pytest
import torch

from turnrl.config import ConfigError, load_config
from turnrl.learner import Learner
from turnrl.learner.samples import collate, micro_batches
from tests.test_ddp import _assert_close, _params, _samples
from turnrl.scale.sharded import ShardedLearner


def _spawn(model, params):
    return ShardedLearner.spawn(2, 60.0, copy.deepcopy(model), params, pad_id=0)


def _long_prefix(samples, n=24):
    """``samples`` behind a shared prompt of ``n`` more tokens: micro-batches then run it once (``Batch.prefix``)."""
    head = list(range(100, 100 + n))
    return [dataclasses.replace(s, input_ids=head + s.input_ids, loss_mask=[0] * n + s.loss_mask,
                                behaviour_logprobs=[0.0] * n + s.behaviour_logprobs, advantages=[0.0] * n + s.advantages)
            for s in samples]


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_two_sharded_ranks_give_the_single_process_update_after_update(tiny_model, shared_prefix):
    params = _params(entropy_coef=0.01, ppo_epochs=2)
    batches = [_samples(5, seed=0), _samples(7, seed=1)]
    if shared_prefix:  # one micro-batch holding every sample behind a long shared prompt: rank 1 runs only a zero pass
        params = dataclasses.replace(params, micro_batch_tokens=4096)
        batches = [_long_prefix(b) for b in batches]
        assert collate(batches[0], 0).prefix and len(micro_batches(batches[0], params.micro_batch_tokens)) == 1
    else:
        assert len(micro_batches(batches[0], params.micro_batch_tokens)) == 3  # uneven: rank 0 pads with a zero pass
    single = Learner(copy.deepcopy(tiny_model), params, pad_id=0)
    fsdp = _spawn(tiny_model, params)
    try:
        for samples in batches:
            expected, got = single.update(samples), fsdp.update(samples)
            _assert_close(list(fsdp.published.parameters()), list(single.model.parameters()), 1e-5)
            assert got.keys() == expected.keys()
            for k in expected:
                assert got[k] == pytest.approx(expected[k], rel=1e-4, abs=1e-6), k
        layers = sum(p.numel() for p in single.model.model.layers.parameters())
        moments = [state["exp_avg"] for state in fsdp.optimizer.state.values()]
        shards = [m for m in moments if hasattr(m, "to_local")]
        assert sum(m.numel() for m in shards) == layers  # every decoder layer's moment is sharded ...
        assert sum(m.to_local().numel() for m in shards) <= layers // 2 + 64 * len(shards)  # ... rank 0 holds half
    finally:
        fsdp.close()


def test_the_checkpoint_state_resumes_the_sharded_learner_exactly(tiny_model):
    params = _params()
    first, second = _samples(5, seed=0), _samples(6, seed=3)
    single = Learner(copy.deepcopy(tiny_model), params, pad_id=0)
    a = _spawn(tiny_model, params)
    try:
        single.update(first)
        a.update(first)
        state, weights = a.state_dict(), copy.deepcopy(a.published)
    finally:
        a.close()
    assert "optimizer_full" in state and state["optimizer_full"]["state"]
    b = _spawn(weights, params)  # a new run: the checkpoint's weights, then its state
    try:
        b.load_state_dict(state)
        single.update(second)
        b.update(second)
        _assert_close(list(b.published.parameters()), list(single.model.parameters()), 1e-5)
        with pytest.raises(ValueError, match="learner_sharding=none"):
            b.load_state_dict(single.state_dict())
    finally:
        b.close()


def test_what_sharding_does_not_support_is_refused_with_the_fix(tiny_model):
    with pytest.raises(ConfigError, match="algo.demo_coef=0"):
        ShardedLearner.spawn(2, 5.0, tiny_model, _params(demo_coef=0.5), pad_id=0)
    with pytest.raises(ConfigError, match="scale.learner_ranks=1"):
        ShardedLearner.spawn(2, 5.0, tiny_model, _params(), pad_id=0, critic=object())


def test_a_sharded_training_run_matches_one_rank_and_resumes_exactly(tmp_path, tokenizer):
    from turnrl.build import build
    from turnrl.loop import train
    from turnrl.models import tiny_model
    from turnrl.monitor.sinks import read_metrics

    def run(name: str, steps: int, sharded: bool, resume: bool = False) -> list[dict]:
        cfg = load_config(None, [
            f"train.steps={steps}", "rollout.tasks_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=3",
            "env.max_turns=2", "eval.num_tasks=2", "eval.every=0", "eval.at_start=false", "log.progress=false",
            "log.tensorboard=false", "log.report=false", "log.checkpoint_every=1", "train.lr=1e-3",
            "train.micro_batch_tokens=64", "model.autocast_bf16=false", "algo.skip_zero_advantage=false",
            *(["scale.learner_ranks=2", "scale.learner_sharding=fsdp"] if sharded else []),
            f"log.run_dir={tmp_path}", f"log.name={name}",
        ])
        c = build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
        try:
            run_dir = train(cfg, components=c, resume=tmp_path / name if resume else None)
            return [r for r in read_metrics(run_dir / "metrics.jsonl") if "train/loss" in r]
        finally:
            if sharded:
                c.learner.close()

    one, two = run("one", 2, False), run("two", 2, True)
    run("resumed", 1, True)
    resumed = run("resumed", 2, True, resume=True)
    assert len(one) == len(two) == len(resumed) == 2 and two[-1]["train/micro_batches"] > 1
    for a, b, r in zip(one, two, resumed):
        for k in ("train/loss", "train/grad_norm", "train/entropy", "train/num_tokens", "rollout/reward"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k
            assert r[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k
    with pytest.raises(ConfigError, match="scale.learner_ranks=2 or more"):
        load_config(None, ["scale.learner_sharding=fsdp"])


def test_under_bf16_autocast_the_sharded_update_is_the_single_process_one_on_the_unrolled_layout(tiny_model):
    """In bf16 running a shared prefix once (the single process) or in every row (the sharded learner) rounds
    differently; on the same layout the two updates agree to fp32 noise."""
    from turnrl.scale.sharded import _unrolled

    class Unrolled(Learner):
        def _policy_backward(self, batch, *rest, **kwargs):
            return super()._policy_backward(_unrolled(batch), *rest, **kwargs)

    params = dataclasses.replace(_params(), micro_batch_tokens=4096, autocast_bf16=True)
    samples = _long_prefix(_samples(7, seed=1))
    single = Unrolled(copy.deepcopy(tiny_model), params, pad_id=0)
    fsdp = _spawn(tiny_model, params)
    try:
        single.update(samples)
        fsdp.update(samples)
        _assert_close(list(fsdp.published.parameters()), list(single.model.parameters()), 1e-6)
    finally:
        fsdp.close()
