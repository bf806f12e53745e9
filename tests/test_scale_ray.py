"""Rollout workers as Ray actors (turnrl.scale.workers): the same trajectories as the in-process collector, weights
synced with their version, a killed worker's chunk re-run on a replacement, a stuck weight sync timed out."""

import threading
import time

import pytest
import ray
import torch

from turnrl.build import build, sampling_params
from turnrl.config import load_config
from turnrl.models import tiny_model
from turnrl.rollout import Collector
from turnrl.scale import ScaleError
from turnrl.scale.workers import RayCollector, split

SEEDS = [0, 1, 2, 3, 4]
LATENCY_MS = 400  # every env step waits this long (turnrl.scale.latency): a collection takes seconds, long enough to kill a worker in


def _cfg(workers: int):
    cfg = load_config(None, [
        "env.id=turnrl.scale.latency:slow_env", "env.max_turns=3", "env.progress_reward=0", "rollout.max_new_tokens=4",
        "rollout.tasks_per_step=5", "rollout.group_size=2", "eval.num_tasks=2", "model.autocast_bf16=false",
        f"scale.workers={workers}",
    ])
    cfg.env.kwargs = {"env": "frozenlake-v0", "latency_ms": LATENCY_MS}
    return cfg


@pytest.fixture(scope="module")
def local_and_ray(tokenizer):
    """The same run built twice, from the same weights: in process, and over 2 Ray workers."""
    ray.init(num_cpus=2, object_store_memory=200_000_000, include_dashboard=False, log_to_driver=False)
    local = build(_cfg(0), model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
    remote = build(_cfg(2), model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
    yield local, remote
    remote.collector.pool.close()
    ray.shutdown()


def _view(groups):
    """Everything a trajectory records that the learner and credit use, logprobs apart."""
    return [(g.seed, t.group_index, t.task_key, t.policy_version, t.termination, t.success,
             [(turn.prompt_ids, turn.response_ids, turn.reward, turn.valid) for turn in t.turns])
            for g in groups for t in g.trajectories]


def _logprobs(groups):
    return torch.tensor([lp for g in groups for t in g.trajectories for turn in t.turns for lp in turn.logprobs])


def _same(a, b):
    assert _view(a) == _view(b)
    assert torch.allclose(_logprobs(a), _logprobs(b), atol=1e-4)


def _collect(c):
    return c.collector.collect(SEEDS, 2, sampling_params(c.cfg, greedy=True), env_id=c.cfg.env.id)


def test_split_keeps_order_and_balances():
    assert split([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
    assert split([7], 3) == [[7]]


def test_workers_give_the_in_process_trajectories(local_and_ray):
    local, remote = local_and_ray
    assert isinstance(local.collector, Collector) and isinstance(remote.collector, RayCollector)
    got = _collect(remote)
    assert [g.seed for g in got] == SEEDS and all(len(g.trajectories) == 2 for g in got)
    _same(got, _collect(local))
    stats = remote.collector.take_stats()
    assert stats.generated_tokens == sum(len(t.response_ids) for g in got for tr in g.trajectories for t in tr.turns)
    assert stats.env_s > 0


def test_each_worker_engine_takes_its_share_of_the_cores(local_and_ray):
    pool = local_and_ray[1].collector.pool
    assert pool.threads == 1  # ray.init(num_cpus=2), 2 workers: oversubscribed threads spin against each other
    threads = ray.get([w.__ray_call__.remote(lambda worker: torch.get_num_threads()) for w in pool.workers])
    assert threads == [1, 1]


def test_new_weights_reach_every_worker_with_their_version(local_and_ray):
    local, remote = local_and_ray
    before = _collect(remote)
    for c in (local, remote):  # the same update on both copies, then the loop's sync
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in c.model.parameters():
                p.add_(0.5 * torch.randn(p.shape, generator=gen))
        c.engine.sync_weights()
    after = _collect(remote)
    assert {t.policy_version for g in after for t in g.trajectories} == {remote.engine.version} == {1}
    assert not torch.allclose(_logprobs(before)[:8], _logprobs(after)[:8])
    _same(after, _collect(local))


def test_a_worker_killed_mid_collect_is_replaced_and_its_tasks_rerun(local_and_ray):
    local, remote = local_and_ray
    pool = remote.collector.pool
    restarts = pool.restarts
    out = {}
    collecting = threading.Thread(target=lambda: out.setdefault("groups", _collect(remote)))
    collecting.start()
    time.sleep(LATENCY_MS / 1000)  # inside the first env step: the worker holds half the episodes
    victim = pool.workers[0]
    ray.kill(victim)
    collecting.join(timeout=120)
    assert not collecting.is_alive()
    assert pool.restarts == restarts + 1 and pool.workers[0] is not victim
    _same(out["groups"], _collect(local))  # complete groups, with the current weights on the replacement


def test_a_stuck_weight_sync_times_out_naming_the_knob(local_and_ray):
    _, remote = local_and_ray
    pool = remote.collector.pool
    busy = threading.Thread(target=lambda: _collect(remote))  # the workers run episodes for over a second
    busy.start()
    time.sleep(0.2)
    pool.sync_timeout_s = 0.3
    try:
        with pytest.raises(ScaleError, match=r"scale\.sync_timeout_s=0\.3"):
            pool.sync(remote.model, remote.engine.version + 1)
    finally:
        pool.sync_timeout_s = remote.cfg.scale.sync_timeout_s
        busy.join(timeout=120)
    got = _collect(remote)  # the failed sync is retried by the next collection
    assert {t.policy_version for g in got for t in g.trajectories} == {remote.engine.version}


def test_scale_knobs_are_validated():
    with pytest.raises(Exception, match="scale.workers"):
        load_config(None, ["scale.workers=-1"])
    with pytest.raises(Exception, match="scale.worker_gpus"):
        load_config(None, ["scale.worker_gpus=-1"])


def test_workers_ask_ray_for_gpus_only_when_told():
    from turnrl.scale.workers import actor_options

    assert actor_options(load_config(None, [])) == {}
    assert actor_options(load_config(None, ["scale.worker_gpus=0.5", "rollout.engine=vllm"])) == {"num_gpus": 0.5}


@pytest.mark.parametrize("driver_speedup, dtype", [(8.0, torch.bfloat16), (0.02, torch.float32)])
def test_workers_sample_in_the_precision_the_driver_chose(local_and_ray, tokenizer, monkeypatch, driver_speedup, dtype):
    """model.autocast_bf16=auto is resolved once, by the driver: a worker does not probe its own CPU (one run, one
    dtype). Both directions are checked, so the test fails on any machine if a worker decided for itself."""
    from turnrl.models import precision

    monkeypatch.setattr(precision, "bf16_speedup", lambda: driver_speedup)
    cfg = _cfg(1)
    cfg.model.autocast_bf16 = "auto"
    c = build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
    try:
        worker = c.collector.pool.workers[0]
        assert ray.get(worker.__ray_call__.remote(lambda w: w.engine.dtype)) == dtype
    finally:
        c.collector.pool.close()
