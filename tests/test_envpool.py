"""The env pool (turnrl.scale.envpool): envs in Ray actors give the in-process trajectories, task split and env replies;
an actor killed mid-step ends only its episode and is replaced; a stuck step times out and its actor is retired."""

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import ray
import torch
from ray import cloudpickle

from turnrl.build import build, sampling_params
from turnrl.config import ConfigError, load_config
from turnrl.engines import SamplingParams, make_engine
from turnrl.envs import Wrapper, make
from turnrl.rollout import Collector
from turnrl.scale.envpool import EnvActorError, EnvPool, RemoteEnv
from turnrl.types import Termination

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors build this file's envs
SEEDS = [0, 1, 2, 3]
SAMPLING = SamplingParams(max_new_tokens=4, temperature=0.0)


class Marked(Wrapper):
    """frozenlake whose steps report the process they ran in (``info["pid"]``) and, when ``marks`` is a directory,
    leave a file named by that pid there, then wait ``seconds`` (forever on seed ``stuck_seed``)."""

    def __init__(self, seconds: float = 0.0, marks: str = "", stuck_seed: int = -1) -> None:
        super().__init__(make("frozenlake-v0", max_turns=3, progress_reward=0.0))
        self.seconds, self.marks, self.stuck_seed, self.seed = seconds, marks, stuck_seed, None

    def reset(self, *, seed=None, options=None):
        self.seed = seed
        return self.env.reset(seed=seed, options=options)

    async def areset(self, *, seed=None, options=None):
        return self.reset(seed=seed, options=options)

    def step(self, action_text):
        if self.marks:
            (Path(self.marks) / str(os.getpid())).touch()
        time.sleep(1e6 if self.seed == self.stuck_seed else self.seconds)
        obs, reward, terminated, truncated, info = self.env.step(action_text)
        return obs, reward, terminated, truncated, info | {"pid": os.getpid()}

    async def astep(self, action_text):
        return self.step(action_text)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, object_store_memory=100_000_000, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def engine(tiny_model, tokenizer):
    return make_engine("native", tiny_model, tokenizer, bf16=False, max_slots=8, max_len=512)


def _cfg(env_actors: int, *more: str):
    return load_config(None, ["env.id=frozenlake-v0", "env.max_turns=3", "rollout.max_new_tokens=4",
                              "rollout.tasks_per_step=4", "rollout.group_size=2", "eval.num_tasks=3",
                              "model.autocast_bf16=false", f"scale.env_actors={env_actors}", *more])


def _view(groups):
    """Everything a trajectory records that the learner and credit use, logprobs apart."""
    return [(g.seed, t.task_key, t.termination, t.success, t.error,
             [(turn.prompt_ids, turn.response_ids, turn.reward, turn.valid, turn.anchor, turn.reward_components)
              for turn in t.turns])
            for g in groups for t in g.trajectories]


def _logprobs(groups):
    return torch.tensor([lp for g in groups for t in g.trajectories for turn in t.turns for lp in turn.logprobs])


def test_env_actors_give_the_in_process_trajectories_and_task_split(tokenizer, tiny_model):
    from turnrl.models import tiny_model as fresh

    local = build(_cfg(0), model=tiny_model, tokenizer=tokenizer)
    remote = build(_cfg(2), model=fresh(tokenizer, seed=0), tokenizer=tokenizer)
    assert isinstance(remote.collector.env_factory(), RemoteEnv)
    assert remote.tasks.eval_tasks == local.tasks.eval_tasks and remote.tasks.train_tasks(1) == local.tasks.train_tasks(1)
    got = [c.collector.collect(SEEDS, 2, sampling_params(c.cfg, greedy=True), env_id="frozenlake-v0") for c in (local, remote)]
    assert _view(got[1]) == _view(got[0])
    assert torch.allclose(_logprobs(got[1]), _logprobs(got[0]), atol=1e-4)  # the engine may batch other turns together
    assert all(t.termination != Termination.ENV_ERROR for g in got[1] for t in g.trajectories)
    remote.collector.env_factory.args[0].close()


def test_a_remote_env_answers_as_the_env_does():
    pool = EnvPool(1, [lambda: make("frozenlake-v0")])
    for seed in (0, 5):
        local, remote = make("frozenlake-v0"), pool.factory(0)()
        assert remote.reset(seed=seed) == local.reset(seed=seed)
        assert (remote.task_key(), remote.anchor(), remote.render(), remote.solve()) == (
            local.task_key(), local.anchor(), local.render(), local.solve())
        assert remote.instructions == local.instructions and remote.examples() == local.examples()
        action = f"<action>{local.solve()[0]}</action>"
        assert remote.step(action) == local.step(action) and remote.anchor() == local.anchor()
        remote.close()
    assert pool.load == [0]
    pool.close()


def test_steps_run_in_the_actors_not_the_training_process(engine, tokenizer):
    pool = EnvPool(2, [Marked])
    groups = Collector(engine, tokenizer, pool.factory(0)).collect([0, 1], 1, SAMPLING)
    pids = {t.info["pid"] for g in groups for tr in g.trajectories for t in tr.turns}
    assert len(pids) == 2 and os.getpid() not in pids  # one actor process per episode
    pool.close()


def _wait_for_mark(marks: Path, timeout: float = 60) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if found := list(marks.iterdir()):
            return int(found[0].name)
        time.sleep(0.05)
    raise AssertionError("no env step started")


@pytest.mark.probe("fault")
def test_an_env_actor_killed_mid_step_ends_only_its_episode_and_is_replaced(engine, tokenizer, tmp_path):
    pool = EnvPool(2, [lambda: Marked(seconds=1.0, marks=str(tmp_path))])
    collector = Collector(engine, tokenizer, pool.factory(0), step_timeout_s=60)
    out = {}
    collecting = threading.Thread(target=lambda: out.setdefault("groups", collector.collect([0, 1], 1, SAMPLING)))
    collecting.start()
    os.kill(_wait_for_mark(tmp_path), signal.SIGKILL)  # kill -9 of the actor inside a step
    collecting.join(timeout=120)
    errors = [t.error for g in out["groups"] for t in g.trajectories if t.termination == Termination.ENV_ERROR]
    assert len(errors) == 1 and "env actor" in errors[0] and "died during step" in errors[0]
    assert EnvActorError.__name__ in errors[0] and "scale.env_actors=0" in errors[0]
    assert pool.restarts == 1
    again = Collector(engine, tokenizer, pool.factory(0)).collect([0, 1], 1, SAMPLING)
    assert all(t.termination != Termination.ENV_ERROR for g in again for t in g.trajectories)
    pool.close()


@pytest.mark.probe("fault")
def test_a_stuck_env_step_times_out_and_its_actor_is_retired(engine, tokenizer, tmp_path):
    pool = EnvPool(2, [lambda: Marked(marks=str(tmp_path), stuck_seed=1)])
    groups = Collector(engine, tokenizer, pool.factory(0), step_timeout_s=3).collect([0, 1], 1, SAMPLING)
    ok, stuck = (g.trajectories[0] for g in groups)
    assert ok.termination != Termination.ENV_ERROR
    assert stuck.termination == Termination.ENV_ERROR and "step took longer than 3 s (env.step_timeout_s)" in stuck.error
    assert pool.restarts == 1
    [stuck_pid] = {int(p.name) for p in tmp_path.iterdir()} - {t.info["pid"] for t in ok.turns}
    end = time.monotonic() + 30
    while _alive(stuck_pid) and time.monotonic() < end:
        time.sleep(0.1)
    assert not _alive(stuck_pid)  # the stuck process was stopped, not left running
    again = Collector(engine, tokenizer, pool.factory(0)).collect([0], 1, SAMPLING)
    assert again[0].trajectories[0].termination != Termination.ENV_ERROR
    pool.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a killed child not yet reaped is a zombie: dead
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.probe("bad_input")
@pytest.mark.parametrize("more, fix", [
    (["scale.workers=1"], "set one of them to 0"),
    (["env.id=nim-v0", "env.progress_reward=0"], "multi-agent.*set scale.env_actors=0"),
    (["experience.retrieve=true"], "experience/skill libraries.*set scale.env_actors=0"),
])
def test_env_actors_refuse_what_they_cannot_carry(tokenizer, tiny_model, more, fix):
    with pytest.raises(ConfigError, match=fix):
        build(_cfg(1, *more), model=tiny_model, tokenizer=tokenizer)
