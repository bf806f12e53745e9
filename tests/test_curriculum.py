"""The curriculum: the band logic of the scheduler, its config errors, and training tasks that follow the level while
held-out evaluation and the held-out task keys do not move."""

import json

import pytest

from turnrl.build import build
from turnrl.config import ConfigError, load_config
from turnrl.envs import Env, register, registered
from turnrl.loop import train
from turnrl.monitor.sinks import read_metrics
from turnrl.rollout.curriculum import Curriculum
from turnrl.types import Trajectory, TrajectoryGroup


class Leveled(Env):
    """One-turn tasks that are always solved at level 0 and never above it; five distinct tasks per level."""

    instructions = "Answer."

    def __init__(self, level: int = 0) -> None:
        if level < 0:
            raise ValueError(f"level={level} must be >= 0")
        self.level = level
        self.seed = 0

    def reset(self, *, seed=None, options=None):
        self.seed = seed or 0
        return f"level {self.level} task {self.seed % 5}", {}

    def step(self, action_text):
        solved = self.level == 0
        r = float(len(action_text) % 2 == 0)  # varied rewards, so a random model gets real gradients
        return "done", r, True, False, {"actions": [action_text], "valid": True, "success": solved}

    def task_key(self) -> str:
        return f"level {self.level} task {self.seed % 5}"


@pytest.fixture
def leveled():
    """``leveled-v0`` in the registry for this test only (registered at import, it would join the every-env checks)."""
    from turnrl.envs import registry

    if "leveled-v0" not in registered():
        register("leveled-v0", Leveled, description="test env: solved at level 0 only")
    yield "leveled-v0"
    registry._REGISTRY.pop("leveled-v0", None)


def _groups(successes: list[bool]) -> list[TrajectoryGroup]:
    return [TrajectoryGroup("x", 0, [Trajectory("x", 0, success=s) for s in successes])]


def test_the_level_rises_above_the_band_falls_below_it_and_stays_inside():
    c = Curriculum([{"size": 3}, {"size": 4}, {"size": 5}], band=(0.25, 0.75), window=2)
    assert c.observe(_groups([True] * 4)) == {"curriculum/level": 0.0, "curriculum/success": 1.0}
    assert c.level == 0  # the window is not full yet
    c.observe(_groups([True, True, True, False]))  # 7/8 > 0.75
    assert c.level == 1 and c.kwargs == {"size": 4} and c.success == 0.0  # a move starts an empty window
    c.observe(_groups([True, False]))
    c.observe(_groups([True, False, False, True]))  # 3/6 = 0.5: inside the band
    assert c.level == 1 and c.success == pytest.approx(0.5)
    c.observe(_groups([False] * 4))  # the window slides: (2 + 0) / 8 = 0.25 is not below the band
    assert c.level == 1
    c.observe(_groups([False] * 4))  # 0 / 8
    assert c.level == 0


def test_the_level_stays_at_either_end():
    c = Curriculum([{"p": 1}, {"p": 2}], band=(0.2, 0.8), window=1)
    c.observe(_groups([False]))
    assert c.level == 0
    c.observe(_groups([True]))
    c.observe(_groups([True]))
    assert c.level == 1


def test_its_state_round_trips_and_a_foreign_level_is_refused():
    c = Curriculum([{"p": 1}, {"p": 2}, {"p": 3}], window=3, start=1)
    c.observe(_groups([True, False]))
    d = Curriculum([{"p": 1}, {"p": 2}, {"p": 3}], window=3)
    d.load_state_dict(json.loads(json.dumps(c.state_dict())))
    assert (d.level, d.success) == (1, 0.5)
    with pytest.raises(ValueError, match="level of 5"):
        d.load_state_dict({"level": 5, "window": []})


@pytest.mark.parametrize("overrides, message", [
    (["curriculum.levels=[3]"], "at least two"),
    (["curriculum.param=size", "curriculum.levels=[{size: 3}, {size: 4}]"], "values of it, not dicts"),
    (["curriculum.levels=[3, 4]"], "name the keyword"),
    (["curriculum.param=size", "curriculum.levels=[3, 4]", "curriculum.start=2"], "past the last"),
    (["curriculum.param=size", "curriculum.levels=[3, 4]", "curriculum.band=[0.8, 0.2]"], "low < high"),
])
def test_a_bad_curriculum_is_a_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["curriculum.enabled=true", *overrides])


def test_a_level_the_env_refuses_and_async_collection_are_clear_errors(tokenizer, tiny_model, leveled):
    base = ["env.id=leveled-v0", "env.progress_reward=0", "curriculum.enabled=true", "curriculum.param=level"]
    with pytest.raises(ConfigError, match=r"curriculum.levels\[1\]=\{'level': -1\}.*must be >= 0"):
        build(load_config(None, [*base, "curriculum.levels=[0, -1]"]), tiny_model, tokenizer)
    with pytest.raises(ConfigError, match="scale.async_mode=false"):
        build(load_config(None, [*base, "curriculum.levels=[0, 1]", "scale.async_mode=true"]), tiny_model, tokenizer)


TINY = ["env.id=leveled-v0", "env.progress_reward=0", "rollout.tasks_per_step=2", "rollout.group_size=2",
        "rollout.max_new_tokens=3", "eval.num_tasks=2", "eval.every=1", "log.progress=false", "log.tensorboard=false",
        "log.report=false", "train.micro_batch_tokens=256", "model.autocast_bf16=false", "curriculum.enabled=true",
        "curriculum.param=level", "curriculum.levels=[0, 1]", "curriculum.window=1"]


def _train(tmp_path, tokenizer, name, steps, resume=False):
    from turnrl.models import tiny_model

    cfg = load_config(None, TINY + [f"log.run_dir={tmp_path}", f"log.name={name}", f"train.steps={steps}",
                                    "log.checkpoint_every=1"])
    c = build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
    return train(cfg, resume=tmp_path / name if resume else None, components=c)


def test_training_tasks_follow_the_level_while_evaluation_and_held_out_keys_stay(tmp_path, tokenizer, leveled):
    """Level 0 is always solved (-> level 1), level 1 never (-> level 0): the levels alternate, the trained task keys
    with them; evaluation stays on env.kwargs (level 0, always solved), whose two tasks no level trains on."""
    run = _train(tmp_path, tokenizer, "alternate", steps=4)
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "curriculum/level" in r]
    assert [r["curriculum/level"] for r in rows] == [0.0, 1.0, 0.0, 1.0]
    assert [r["rollout/success_rate"] for r in rows] == [1.0, 0.0, 1.0, 0.0]
    assert all(r["eval/success_rate"] == 1.0 for r in read_metrics(run / "metrics.jsonl") if "eval/success_rate" in r)
    splits = [json.loads(line) for line in (run / "task_keys.jsonl").read_text().splitlines()]
    held = {t["key"] for r in splits if r["split"] == "eval" for t in r["tasks"]}
    assert held == {"level 0 task 0", "level 0 task 1"}  # seeds 1_000_000 and 1_000_001
    trained = [[t["key"] for t in r["tasks"]] for r in splits if r["split"] == "train"]
    assert [{k.split(" task")[0] for k in keys} for keys in trained] == [{"level 0"}, {"level 1"}, {"level 0"}, {"level 1"}]
    assert not held & {k for keys in trained for k in keys}
    assert "level 1 task 1" in trained[3]  # the same task number at another level is not held out


def test_a_resumed_run_continues_at_the_checkpointed_level(tmp_path, tokenizer, leveled):
    _train(tmp_path, tokenizer, "resumed", steps=1)  # level 0 solved: the checkpoint holds level 1
    run = _train(tmp_path, tokenizer, "resumed", steps=2, resume=True)
    assert [r["curriculum/level"] for r in read_metrics(run / "metrics.jsonl") if "curriculum/level" in r] == [0.0, 1.0]


def test_sft_demonstrations_at_every_level_split_evenly_and_leave_the_level(tokenizer, tiny_model):
    """``sft.demo_levels=all``: the oracle's demonstrations come from each level's training tasks in turn (3x3 then
    4x4 maps here), ``num`` split evenly, none on a held-out map; the curriculum is back at its level afterwards.
    Without a curriculum the setting is refused with the fix."""
    from turnrl.sft import load_demos

    cfg = load_config(None, ["model.autocast_bf16=false", "eval.num_tasks=4", "curriculum.enabled=true",
                             "curriculum.param=size", "curriculum.levels=[3, 4]", "sft.demo_levels=all",
                             "sft.num_demos=5"])
    c = build(cfg, model=tiny_model, tokenizer=tokenizer)
    demos, source = load_demos(c)
    sizes = [len(d.task_key.split("/")) for d in demos]
    assert source == "oracle" and sizes == [3, 3, 3, 4, 4] and all(d.success for d in demos)
    assert len({d.task_key for d in demos}) == 5 and not {d.task_key for d in demos} & c.tasks.held_keys
    assert c.curriculum.level == 0
    start = load_config(None, ["curriculum.enabled=true", "curriculum.param=size", "curriculum.levels=[3, 4]",
                               "sft.num_demos=2"])
    assert {len(d.task_key.split("/")) for d in load_demos(build(start, model=tiny_model, tokenizer=tokenizer))[0]} == {3}
    with pytest.raises(ConfigError, match="curriculum.enabled=true"):
        load_config(None, ["sft.demo_levels=all"])
    with pytest.raises(ConfigError, match="sft.demos=oracle"):
        load_config(None, ["curriculum.enabled=true", "curriculum.param=size", "curriculum.levels=[3, 4]",
                           "sft.demo_levels=all", "sft.demos=file", "sft.demo_file=demos.jsonl"])
