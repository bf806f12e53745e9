"""The reward-hacking testbed: a flawed training verifier, a trusted one for evaluation."""

import json

from turnrl.config import load_config
from turnrl.envs import check_env, make
from turnrl.monitor.sinks import read_metrics
from turnrl.build import build
from turnrl.loop import train


def test_hackable_env_keeps_the_contract_and_its_flaw_pays_without_solving():
    check_env("frozenlake-hackable-v0", seeds=(0, 1, 2))
    env = make("frozenlake-hackable-v0")
    env.reset(seed=3)
    _, reward, terminated, _, info = env.step("Up")
    assert (reward, terminated, info["success"], info["trusted_success"]) == (1.0, True, True, False)
    env.reset(seed=3)
    env.step("Left")
    _, _, _, _, info = env.step("Up")  # only the first move is gamed
    assert info["trusted_success"] == info["success"]


def test_eval_runs_on_the_trusted_env(tmp_path, tokenizer, tiny_model):
    cfg = load_config(None, ["env.id=frozenlake-hackable-v0", "eval.env_id=frozenlake-v0", "train.steps=1",
                             "rollout.tasks_per_step=1", "rollout.group_size=2", "rollout.max_new_tokens=3", "eval.num_tasks=2",
                             "log.progress=false", "log.tensorboard=false", f"log.run_dir={tmp_path}", "log.name=h",
                             "model.autocast_bf16=false"])
    c = build(cfg, model=tiny_model, tokenizer=tokenizer)
    from turnrl.envs.hackable import HackableFrozenLake

    assert not isinstance(c.eval_collector.env_factory().unwrapped, HackableFrozenLake)
    assert isinstance(c.collector.env_factory().unwrapped, HackableFrozenLake)
    train(cfg, components=c)
    rows = [json.loads(x) for x in (tmp_path / "h" / "trajectories.jsonl").read_text().splitlines()]
    assert rows and all(r["env_id"] == "frozenlake-hackable-v0" for r in rows)
    assert "eval/success_rate" in read_metrics(tmp_path / "h" / "metrics.jsonl")[-1]


def test_bad_eval_env_is_a_config_error(tokenizer, tiny_model):
    import pytest

    from turnrl.config import ConfigError

    cfg = load_config(None, ["eval.env_id=frozenlake-v9"])
    with pytest.raises(ConfigError, match="eval.env_id"):
        build(cfg, model=tiny_model, tokenizer=tokenizer)
