"""Demonstrations (turnrl.agent.demos, turnrl.sft's oracle): exact ids, agent-only loss masks, training tasks only, JSONL."""

import json

import pytest

from turnrl.agent.demos import demo_batch, demos_from_run, read_demos, write_demos
from turnrl.build import build, demo_samples, sampling_params
from turnrl.config import ConfigError, load_config, write_config
from turnrl.engines.base import Completion
from turnrl.envs import make
from turnrl.rollout import Collector
from turnrl.sft import OracleEngine, load_demos, oracle_demos
from turnrl.types import Advantages, TrajectoryGroup

SMALL = ["eval.num_tasks=4", "rollout.engine=hf", "model.autocast_bf16=false", "rollout.tasks_per_step=2"]


def components(tokenizer, tiny_model, *overrides):
    return build(load_config(None, [*SMALL, *overrides]), model=tiny_model, tokenizer=tokenizer)


class ScriptedEngine:
    """Answers the i-th prompt with the i-th text's token ids plus EOS, as a model that wrote it and stopped would."""

    version = 0

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.prompts = tokenizer, list(texts), []

    def generate(self, prompts, params):
        self.prompts += prompts
        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        return [Completion(ids, [0.0] * len(ids), "stop")]

    def sync_weights(self):
        pass

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


@pytest.mark.parametrize("strategy", ["per_step", "full"])
def test_a_demonstration_is_what_the_collector_records_for_the_oracles_actions(tokenizer, tiny_model, strategy):
    c = components(tokenizer, tiny_model, "env.id=sokoban-v0", "env.max_turns=20", f"rollout.context={strategy}",
                   "rollout.history_turns=1")
    demos = oracle_demos(c, 3)
    assert len(demos) == 3 and all(d.success and d.context == strategy for d in demos)
    for demo in demos:
        env = make("sokoban-v0", max_turns=20)
        env.reset(seed=demo.seed)
        for turn in demo.turns:  # each response is the env's own plan, tokenized, ended with EOS
            action = env.solve()[0]
            assert turn.response_text == action
            assert turn.response_ids == tokenizer.encode(action, add_special_tokens=False) + [tokenizer.eos_token_id]
            env.step(action)
        engine = ScriptedEngine(tokenizer, [t.response_text for t in demo.turns])
        replay = Collector(engine, tokenizer, c.tasks.train_envs, c.collector.context).collect(
            [demo.seed], 1, sampling_params(c.cfg, greedy=True))[0].trajectories[0]
        assert [t.prompt_ids for t in replay.turns] == [t.prompt_ids for t in demo.turns]
        assert [t.response_ids for t in replay.turns] == [t.response_ids for t in demo.turns]
        assert replay.success and replay.task_key == demo.task_key
        if strategy == "per_step":  # the renderer's prompt: instructions, few-shot, the observation
            renderer = c.collector.renderer(env)
            assert demo.turns[0].prompt_ids == renderer.per_step_prompt(demo.turns[0].observation)


def test_a_multi_agent_env_is_demonstrated_by_a_team_of_oracles_one_trajectory_per_role(tokenizer, tiny_model):
    c = components(tokenizer, tiny_model, "env.id=relay-v0", "env.kwargs={doors: 3}", "env.progress_reward=0",
                   "rollout.max_new_tokens=24")
    demos = oracle_demos(c, 4)
    assert len(demos) == 4 and all(d.success for d in demos) and {d.agent for d in demos} == {"speaker", "listener"}
    assert not {d.task_key for d in demos} & c.tasks.held_keys
    for demo in demos:  # each turn is the role's oracle action on the same task, tokenized and ended with EOS
        env = make("relay-v0", doors=3)
        env.reset(seed=demo.seed)
        speaker = env.oracle("speaker")
        env.step({"speaker": speaker})
        action = speaker if demo.agent == "speaker" else env.oracle("listener")
        assert [t.response_text for t in demo.turns] == [action]
        assert demo.turns[0].response_ids == tokenizer.encode(action, add_special_tokens=False) + [tokenizer.eos_token_id]
        assert demo.task_key == env.task_key()
    samples = demo_samples(demos)  # what turnrl sft trains on: only the role's own tokens
    assert [[i for i, m in zip(s.input_ids, s.loss_mask) if m] for s in samples] == [d.turns[0].response_ids for d in demos]


@pytest.mark.parametrize("strategy", ["per_step", "full"])
def test_the_loss_mask_covers_only_the_agents_tokens(tokenizer, tiny_model, strategy):
    c = components(tokenizer, tiny_model, "env.id=frozenlake-v0", f"rollout.context={strategy}")
    demos = oracle_demos(c, 2)
    samples = demo_samples(demos)
    assert len(samples) == (2 if strategy == "full" else sum(len(d.turns) for d in demos))
    for s in samples:
        turns = demos[s.traj_index].turns if s.turn_index < 0 else [demos[s.traj_index].turns[s.turn_index]]
        expected_ids, expected_mask = [], []
        for t in turns:
            expected_ids += t.prompt_ids + t.response_ids
            expected_mask += [0] * len(t.prompt_ids) + [1] * len(t.response_ids)
        assert s.input_ids == expected_ids and s.loss_mask == expected_mask
        trained = [i for i, m in zip(s.input_ids, s.loss_mask) if m]
        assert trained == [i for t in turns for i in t.response_ids]


def test_demonstrations_are_only_made_on_training_tasks(tokenizer, tiny_model, tmp_path):
    c = components(tokenizer, tiny_model, "env.id=frozenlake-v0")
    demos = oracle_demos(c, 6)
    assert len(demos) == 6 and not {d.task_key for d in demos} & c.tasks.held_keys
    # a file that also holds demonstrations of every held-out task (one of them mislabelled as another task)
    engine = OracleEngine(tokenizer)
    held = Collector(engine, tokenizer, engine.envs_from(c.tasks.train_envs), c.collector.context).collect(
        [t.seed for t in c.tasks.eval_tasks], 1, sampling_params(c.cfg, greedy=True), env_id=c.cfg.env.id)
    held = [g.trajectories[0] for g in held]
    assert {d.task_key for d in held} == c.tasks.held_keys
    held[0].task_key = "some training task"
    path = write_demos(tmp_path / "demos.jsonl", held + demos, "test", len(tokenizer))
    c.cfg.sft.demo_file, c.cfg.sft.demos = str(path), "file"
    kept, source = load_demos(c)
    assert [d.seed for d in kept] == [d.seed for d in demos] and source == f"file:{path}"


def test_the_jsonl_round_trips_and_bad_files_fail_clearly(tokenizer, tiny_model, tmp_path):
    c = components(tokenizer, tiny_model, "env.id=countdown-v0", "rollout.max_new_tokens=64")
    demos = oracle_demos(c, 3)
    assert len(demos) == 3
    path = write_demos(tmp_path / "d.jsonl", demos, "oracle", len(tokenizer))
    back = read_demos(path, len(tokenizer))
    fields = ("prompt_ids", "response_ids", "response_text", "observation", "actions", "valid", "reward", "finish_reason")
    for a, b in zip(demos, back, strict=True):
        assert (a.env_id, a.seed, a.task_key, a.context, a.success, a.termination) == \
               (b.env_id, b.seed, b.task_key, b.context, b.success, b.termination)
        assert [[getattr(t, f) for f in fields] for t in a.turns] == [[getattr(t, f) for f in fields] for t in b.turns]
    with pytest.raises(ConfigError, match="tokenizer of"):
        read_demos(path, len(tokenizer) + 1)
    path.write_text(path.read_text() + '{"format": "other"}\n')
    with pytest.raises(ConfigError, match=r"d.jsonl:4 is not a demonstration.*docs/demos.md"):
        read_demos(path)
    with pytest.raises(ConfigError, match="no demonstration file"):
        read_demos(tmp_path / "missing.jsonl")


def test_a_runs_successful_recorded_trajectories_are_demonstrations(tokenizer, tiny_model, tmp_path):
    from turnrl.monitor.records import write_trajectories

    c = components(tokenizer, tiny_model, "env.id=frozenlake-v0", "rollout.context=full")
    demos = oracle_demos(c, 2)
    failed = demos[0].__class__(env_id=demos[0].env_id, seed=99, turns=demos[0].turns, success=False)
    groups = [TrajectoryGroup(d.env_id, d.seed, [d]) for d in [*demos, failed]]
    write_trajectories(tmp_path, 1, groups, Advantages.zeros([*demos, failed]), tokenizer, limit=10)
    write_config(c.cfg, tmp_path / "config.yaml")
    back = demos_from_run(tmp_path)
    assert [d.seed for d in back] == [d.seed for d in demos] and all(d.context == "full" for d in back)
    assert [s.input_ids for s in demo_samples(back)] == [s.input_ids for s in demo_samples(demos)]
    assert json.loads((tmp_path / "trajectories.jsonl").read_text().splitlines()[2])["success"] is False


def test_demo_batches_cycle_in_order():
    assert demo_batch([1, 2, 3], 0, 2) == [1, 2] and demo_batch([1, 2, 3], 1, 2) == [3, 1]
    assert demo_batch([1, 2], 5, 8) == [1, 2] and demo_batch([], 3, 4) == []
