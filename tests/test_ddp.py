"""The data-parallel learner (turnrl.scale.distributed): 2 gloo ranks give the single-process gradient, update
after update, and a stuck rank stops the update with an error naming scale.sync_timeout_s instead of hanging."""

import copy
import dataclasses
import os
import signal
import time

import pytest
import torch

from turnrl.config import ConfigError, load_config
from turnrl.learner import Learner, LearnerParams
from turnrl.learner.samples import micro_batches
from turnrl.scale import ScaleError
from turnrl.scale.distributed import DataParallelLearner
from turnrl.types import TrainSample


def _samples(n=5, seed=0):
    """Samples of a shared prompt, an observation and a response, with varied advantages and behaviour logprobs."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(5, 1000, (12,), generator=g).tolist()
    out = []
    for i in range(n):
        obs = torch.randint(5, 1000, (3 + i % 3,), generator=g).tolist()
        resp = torch.randint(5, 1000, (2 + i % 4,), generator=g).tolist()
        ids = prefix + obs + resp
        head = len(ids) - len(resp)
        out.append(TrainSample(ids, [0] * head + [1] * len(resp), [0.0] * head + [-7.0 + 0.3 * i] * len(resp),
                               [0.0] * head + [(-1.0) ** i * (1.0 + i)] * len(resp)))
    return out


def _params(**fields) -> LearnerParams:
    cfg = load_config(None, ["model.autocast_bf16=false", "train.lr=1e-3", "train.grad_clip=1e9"])
    return dataclasses.replace(LearnerParams.from_config(cfg), micro_batch_tokens=16, **fields)


def _stepped_grads(learner) -> list[list[torch.Tensor]]:
    """The gradients of every optimizer step ``learner`` takes from now on (it frees them after the step)."""
    seen: list[list[torch.Tensor]] = []
    learner.optimizer.register_step_pre_hook(lambda *_: seen.append([p.grad.clone() for p in learner.model.parameters()]))
    return seen


def _assert_close(a: list[torch.Tensor], b: list[torch.Tensor], rel: float) -> None:
    with torch.no_grad():
        for x, y in zip(a, b, strict=True):
            assert float((x - y).norm()) <= rel * max(float(y.norm()), 1e-12)


def test_two_ranks_give_the_single_process_gradient_update_after_update(tiny_model):
    params = _params(entropy_coef=0.01, demo_coef=0.5)  # demonstrations' NLL (algo.demo_coef): rank 0 adds it once
    batches = [_samples(5, seed=0), _samples(7, seed=1)]
    demos = _samples(3, seed=2)
    assert len(micro_batches(batches[0], params.micro_batch_tokens)) == 3  # uneven: rank 0 runs 2, rank 1 runs 1
    single = Learner(copy.deepcopy(tiny_model), params, pad_id=0)
    ddp = DataParallelLearner.spawn(2, 60.0, copy.deepcopy(tiny_model), params, pad_id=0)
    single_grads, ddp_grads = _stepped_grads(single), _stepped_grads(ddp)
    try:
        for samples in batches:  # the second update needs rank 1 to hold the weights rank 0 stepped to
            expected, got = single.update(samples, None, demos), ddp.update(samples, None, demos)
            _assert_close(ddp_grads[-1], single_grads[-1], 1e-6)
            _assert_close(list(ddp.model.parameters()), list(single.model.parameters()), 1e-6)
            assert got.keys() == expected.keys()
            for k in expected:
                assert got[k] == pytest.approx(expected[k], rel=1e-5, abs=1e-7), k
        assert len(single_grads) == len(ddp_grads) == len(batches)
    finally:
        ddp.close()


def test_a_stuck_rank_times_out_with_an_error_naming_the_knob(tiny_model):
    ddp = DataParallelLearner.spawn(2, 2.0, copy.deepcopy(tiny_model), _params(), pad_id=0)
    helper = ddp._helpers[0]
    try:
        os.kill(helper.pid, signal.SIGSTOP)
        t0 = time.perf_counter()
        with pytest.raises(ScaleError, match=r"scale\.sync_timeout_s=2 s"):
            ddp.update(_samples())
        assert time.perf_counter() - t0 < 30
    finally:
        ddp.close()
    assert not helper.is_alive()


def test_a_critic_is_refused_with_the_fix(tiny_model):
    with pytest.raises(ConfigError, match="scale.learner_ranks=1"):
        DataParallelLearner.spawn(2, 5.0, tiny_model, _params(), pad_id=0, critic=object())


def test_a_training_run_with_two_learner_ranks_matches_one(tmp_path, tokenizer):
    from turnrl.build import build
    from turnrl.loop import train
    from turnrl.models import tiny_model
    from turnrl.monitor.sinks import read_metrics

    def run(ranks: int) -> list[dict]:
        cfg = load_config(None, [
            "train.steps=2", "rollout.tasks_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=3",
            "env.max_turns=2", "eval.num_tasks=2", "eval.every=0", "eval.at_start=false", "log.progress=false",
            "log.tensorboard=false", "log.report=false", "log.checkpoint_at_end=false", "train.lr=1e-3",
            "train.micro_batch_tokens=64", "model.autocast_bf16=false", "algo.skip_zero_advantage=false",
            f"scale.learner_ranks={ranks}", f"log.run_dir={tmp_path}", f"log.name=ranks{ranks}",
        ])
        c = build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
        try:
            return [r for r in read_metrics(train(cfg, components=c) / "metrics.jsonl") if "train/loss" in r]
        finally:
            if ranks > 1:
                c.learner.close()

    one, two = run(1), run(2)
    assert len(one) == len(two) == 2
    assert two[-1]["train/micro_batches"] > 1  # rank 1 had work
    for a, b in zip(one, two):
        for k in ("train/loss", "train/grad_norm", "train/entropy", "train/num_tokens", "rollout/reward"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k


def test_ranks_started_by_torchrun_train_as_the_spawned_ones_do(tmp_path, tiny_model_dir):
    """`torchrun --nproc-per-node 2 -m turnrl.cli train ... scale.learner_ranks=2`: rank 0 trains, rank 1 joins through
    env:// and serves its updates, and the run's numbers are the one-process run's. A launch that disagrees with
    scale.learner_ranks stops with the fix."""
    import subprocess
    import sys

    from turnrl.monitor.sinks import read_metrics

    base = ["train", f"model.path={tiny_model_dir}", "train.steps=2", "rollout.tasks_per_step=2", "rollout.group_size=3",
            "rollout.max_new_tokens=3", "env.max_turns=2", "eval.every=0", "eval.at_start=false", "log.progress=false",
            "log.tensorboard=false", "log.report=false", "log.checkpoint_at_end=false", "log.checkpoint_every=0",
            "train.lr=1e-3", "train.micro_batch_tokens=64", "model.autocast_bf16=false",
            "algo.skip_zero_advantage=false", "train.threads=1", f"log.run_dir={tmp_path}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "turnrl.cli"]

    def rows(name: str) -> list[dict]:
        return [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if "train/loss" in r]

    one = subprocess.run([sys.executable, "-m", "turnrl.cli", *base, "log.name=one"], env=env, capture_output=True,
                         text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([*launch, *base, "log.name=two", "scale.learner_ranks=2"], env=env, capture_output=True,
                         text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    assert not (tmp_path / "served").exists()
    a, b = rows("one"), rows("two")
    assert len(a) == len(b) == 2
    assert b[-1]["train/micro_batches"] > 1  # rank 1 had work
    for x, y in zip(a, b):
        for k in ("train/loss", "train/grad_norm", "train/num_tokens", "rollout/reward"):
            assert y[k] == pytest.approx(x[k], rel=1e-4, abs=1e-6), k

    wrong = subprocess.run([*launch, *base, "log.name=wrong"], env=env, capture_output=True, text=True, timeout=600)
    assert wrong.returncode != 0
    assert "set scale.learner_ranks=2" in wrong.stderr
