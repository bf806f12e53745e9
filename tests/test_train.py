"""Smoke runs of the whole loop with a tiny model, and exact resume."""

import json
import math

import pytest
import torch

from turnrl.config import load_config
from turnrl.envs import Env, register, registered
from turnrl.monitor.sinks import read_metrics
from turnrl.build import build
from turnrl.loop import train


class Parity(Env):
    """Pays 1 when the response has an even number of characters: random text gets varied rewards, so a tiny
    random model still produces non-zero advantages and real gradients."""

    instructions = "Answer."

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return f"task {seed}", {}

    def step(self, action_text):
        self.t += 1
        r = float(len(action_text) % 2 == 0)
        done = self.t >= 2
        return f"turn {self.t}", r, done, False, {"actions": [action_text], "valid": True, "success": done and r > 0,
                                                  "reward_components": {"outcome": r}}

    def anchor(self):
        return str(self.t)


if "parity-v0" not in registered():
    register("parity-v0", Parity, description="test env")

TINY = [
    "train.steps=2", "rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=3",
    "eval.num_tasks=2", "eval.every=1", "log.progress=false", "log.tensorboard=false", "train.lr=1e-3",
    "train.micro_batch_tokens=256", "model.autocast_bf16=false", "env.id=parity-v0", "env.progress_reward=0",
]


def _run(tmp_path, tokenizer, overrides, name, resume=False, steps=None):
    from turnrl.models import tiny_model

    cfg = load_config(None, TINY + [f"log.run_dir={tmp_path}", f"log.name={name}"] + overrides)
    if steps is not None:
        cfg.train.steps = steps
    c = build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
    return train(cfg, resume=(tmp_path / name) if resume else None, components=c), c


@pytest.mark.parametrize("context", ["per_step", "full"])
def test_two_step_smoke_run_writes_a_run_directory(tmp_path, tokenizer, context):
    run_dir, _ = _run(tmp_path, tokenizer, [f"rollout.context={context}", "log.tensorboard=true"], f"smoke-{context}")
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert "eval/success_rate" in rows[0] and "train/loss" in rows[-1] and "perf/train_s" in rows[-1]
    assert (run_dir / "config.yaml").exists() and any((run_dir / "tb").iterdir())
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000002"
    traj = json.loads((run_dir / "trajectories.jsonl").read_text().splitlines()[0])
    assert traj["turns"] and "advantage" in traj["turns"][0]
    assert rows[-1]["train/num_tokens"] > 0 and rows[-1]["train/grad_norm"] > 0
    assert 0.05 < rows[-1]["perf/max_rss_gb"] < 64  # a real measurement in GB, not KiB or bytes
    assert "trajectory" in (run_dir / "report.html").read_text().lower()  # the report is part of the run directory


def test_smoke_run_with_kl_to_a_frozen_reference(tmp_path, tokenizer):
    run_dir, c = _run(tmp_path, tokenizer, ["model.reference=true", "algo.kl_coef=0.5", "algo.kl_type=k3"], "kl")
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows[-1]["train/kl"] > 0  # after the first update the policy has moved away from the reference
    assert all(not p.requires_grad for p in c.learner.ref_model.parameters())


def test_smoke_run_with_group_filtering_and_overlong_masking(tmp_path, tokenizer):
    run_dir, _ = _run(tmp_path, tokenizer, ["algo.group_keep_fraction=0.5", "algo.mask_overlong=true", "rollout.max_new_tokens=2"], "filters")
    rows = read_metrics(run_dir / "metrics.jsonl")
    # every response of the tiny model hits the 2-token limit, so masking leaves nothing to train on
    assert rows[-1]["train/num_samples"] == 0 and rows[-1]["rollout/response_truncated_rate"] > 0.5


def test_smoke_run_with_gspo_entropy_bonus_and_dr_grpo_aggregation(tmp_path, tokenizer):
    run_dir, _ = _run(tmp_path, tokenizer, ["algo.ratio_level=sequence", "algo.clip_low=0.0003", "algo.clip_high=0.0004",
                                            "algo.entropy_coef=0.01", "algo.loss_agg=seq-mean-token-sum-norm",
                                            "algo.norm_std=false"], "gspo")
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows[-1]["train/num_samples"] > 0 and math.isfinite(rows[-1]["train/loss"])
    assert rows[-1]["train/ratio_mean"] == pytest.approx(1.0, abs=1e-3)  # one on-policy epoch: the GSPO ratio is 1
    assert rows[-1]["train/entropy"] > 0


def test_smoke_run_with_a_process_reward_model_and_reward_clipping(tmp_path, tokenizer):
    run_dir, _ = _run(tmp_path, tokenizer, ["algo.prm=tests.test_rewards:length_prm", "algo.prm_weight=0.5",
                                            "algo.reward_clip=0.75", "algo.estimator=grpo_turn"], "prm")
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert "rollout/reward/prm" in rows[-1] and rows[-1]["rollout/reward/prm"] <= 0  # random text is never 'Right'


def test_smoke_run_on_frozenlake(tmp_path, tokenizer, monkeypatch):
    """The logged validity is the fraction of turns whose text FrozenLake's own parser reads as a move."""
    from turnrl.envs.frozenlake import ACTIONS
    from turnrl.envs.parsing import parse_actions
    from turnrl.rollout import Collector

    collected = []
    real_collect = Collector.collect

    def spy(self, seeds, group_size, *args, **kwargs):
        groups = real_collect(self, seeds, group_size, *args, **kwargs)
        if group_size == 2:  # the training rollouts (evaluation runs one episode per task)
            collected.append(groups)
        return groups

    monkeypatch.setattr(Collector, "collect", spy)
    run_dir, _ = _run(tmp_path, tokenizer, ["env.id=frozenlake-v0", "env.progress_reward=0.2", "algo.estimator=gigpo",
                                            "algo.skip_zero_advantage=false"], "fl")
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "rollout/valid_action_rate" in r]
    assert len(rows) == len(collected) == 2 and "train/loss" in rows[-1]
    for row, groups in zip(rows, collected):
        turns = [t for g in groups for traj in g.trajectories for t in traj.turns]
        judged = [bool(parse_actions(t.response_text, ACTIONS, 1)) for t in turns]
        assert [t.valid for t in turns] == judged
        assert row["rollout/valid_action_rate"] == pytest.approx(sum(judged) / len(judged))


@pytest.mark.parametrize("engine", ["hf", "native"])
def test_resume_continues_bit_identically(tmp_path, tokenizer, engine):
    common = ["train.steps=4", "log.checkpoint_every=2", "log.keep_checkpoints=5", "eval.every=0", "eval.at_start=false",
              f"rollout.engine={engine}"]
    full_dir, full = _run(tmp_path, tokenizer, common, "full")
    # interrupted run: stop after 2 steps (checkpoint at 2), then resume to 4 in a fresh process state
    _run(tmp_path, tokenizer, common, "split", steps=2)
    torch.manual_seed(12345)  # scramble global RNG state: resume must restore it
    split_dir, split = _run(tmp_path, tokenizer, common, "split", resume=True)
    for (k, a), (_, b) in zip(full.model.state_dict().items(), split.model.state_dict().items()):
        assert torch.equal(a, b), k
    from turnrl.models import tiny_model

    init = tiny_model(tokenizer, seed=0).state_dict()
    assert any(not torch.equal(init[k], v) for k, v in full.model.state_dict().items())  # training did move the weights
    a = [r for r in read_metrics(full_dir / "metrics.jsonl") if r["step"] in (3, 4)]
    b = [r for r in read_metrics(split_dir / "metrics.jsonl") if r["step"] in (3, 4)]
    assert [r["train/loss"] for r in a] == [r["train/loss"] for r in b]


def test_resuming_a_directory_that_does_not_exist_is_a_clear_error(tmp_path, tokenizer):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        _run(tmp_path, tokenizer, [], "missing", resume=True)


def test_an_alert_can_stop_the_run_with_a_checkpoint(tmp_path, tokenizer, monkeypatch):
    from turnrl.monitor.detectors import Alert, Detector

    class AlwaysFires(Detector):
        name = "always"

        def update(self, step, metrics):
            return Alert(self.name, step, "synthetic alarm", {"step": step})

    monkeypatch.setattr("turnrl.monitor.monitor.default_detectors", lambda: [AlwaysFires()])
    run_dir, _ = _run(tmp_path, tokenizer, ["train.steps=3", "monitor.on_alert=stop"], "alarm")
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")][-1] == 1
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000001"
    assert json.loads((run_dir / "alerts.jsonl").read_text().splitlines()[0])["name"] == "always"


def test_rollback_restores_the_last_checkpoint_saved_before_the_alert(tmp_path, tokenizer, monkeypatch):
    """An alert at step 3 with on_alert=rollback: step 4 starts from the step-2 checkpoint's weights."""
    import turnrl.loop as T
    from turnrl.monitor.detectors import Alert, Detector

    fired = []

    class FiresOnceAtStep3(Detector):
        name = "grad_spike"

        def update(self, step, metrics):
            if step == 3 and not fired:
                fired.append(step)
                return Alert(self.name, step, "synthetic spike", {"step": step})
            return None

    weights_at_start = []
    real_collect = T.collect_step

    def spy(c, step, sampling):
        weights_at_start.append({k: v.clone() for k, v in c.model.state_dict().items()})
        return real_collect(c, step, sampling)

    monkeypatch.setattr("turnrl.monitor.monitor.default_detectors", lambda: [FiresOnceAtStep3()])
    monkeypatch.setattr(T, "collect_step", spy)
    run_dir, c = _run(tmp_path, tokenizer, ["train.steps=4", "log.checkpoint_every=2", "log.keep_checkpoints=3",
                                            "eval.every=0", "eval.at_start=false", "monitor.actions={grad_spike: rollback}"], "rb")
    before_step3, before_step4 = weights_at_start[2], weights_at_start[3]  # after 2 updates; after the rollback
    assert all(torch.equal(before_step3[k], before_step4[k]) for k in before_step3)
    assert any(not torch.equal(weights_at_start[1][k], before_step3[k]) for k in before_step3)  # updates do move weights
    records = [json.loads(line) for line in (run_dir / "alerts.jsonl").read_text().splitlines()]
    assert [r["name"] for r in records] == ["grad_spike", "rollback"] and records[1]["evidence"]["to_step"] == 2
    assert read_metrics(run_dir / "metrics.jsonl")[-1]["monitor/rollbacks"] == 1.0


def test_monitor_actions_must_name_a_detector():
    from turnrl.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match="grad_spike"):
        load_config(None, ["monitor.actions={grad_spikes: rollback}"])


def test_dynamic_sampling_fills_the_batch_with_informative_groups(tmp_path, tokenizer):
    run_dir, c = _run(tmp_path, tokenizer, ["algo.dynamic_sampling_rounds=3", "rollout.group_size=2"], "dyn")
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "rollout/train_groups" in r]
    assert rows and all(r["rollout/train_groups"] <= 2 <= r["rollout/collected_groups"] for r in rows)
    from turnrl.build import sampling_params
    from turnrl.loop import collect_step

    train_groups, collected, tasks, stats = collect_step(c, 5, sampling_params(c.cfg))
    assert stats.generated_tokens > 0
    assert [t.seed for t in tasks] == [g.seed for g in collected]
    assert all(len(set(g.rewards)) > 1 for g in train_groups)
    assert len(train_groups) == 2 or len(collected) == 6  # filled, or every round was used


def test_train_seeds_are_disjoint_across_steps_and_rounds():
    from turnrl.build import TaskSplit, env_factories

    cfg = load_config(None, ["algo.dynamic_sampling_rounds=3", "rollout.tasks_per_step=4", "env.id=parity-v0",
                             "env.progress_reward=0"])
    tasks = TaskSplit(cfg, *env_factories(cfg))
    seen = [t.seed for step in range(5) for r in range(3) for t in tasks.train_tasks(step, r)]
    assert seen == list(range(60))  # every parity task is distinct: the blocks of consecutive seeds, as before
    again = TaskSplit(cfg, *env_factories(cfg))  # a resumed run draws the same tasks for a later step directly
    assert again.train_tasks(4, 2) == tasks.train_tasks(4, 2)


def test_env_reward_success_reaches_the_envs_the_run_builds():
    from turnrl.build import env_factories

    cfg = load_config(None, ["env.id=webshop-v0", "env.reward=success", "env.progress_reward=0", "env.invalid_penalty=0"])
    env = env_factories(cfg)[0]()
    env.reset(seed=6)
    *_, info = env.step("click[Buy Now]")  # not on a product page: invalid, and no reward either way
    assert info["reward_components"] == {"success": 0.0}
    from turnrl.config import ConfigError

    with pytest.raises(ConfigError, match="env.reward"):
        load_config(None, ["env.reward=partial"])


def test_checkpoints_keep_exactly_the_newest_n(tmp_path, tokenizer, tiny_model):
    from turnrl import checkpoint

    for step in (1, 2, 3, 4):
        checkpoint.save_checkpoint(tmp_path, step, tiny_model, tokenizer, {}, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_000003", "step_000004"]
    assert checkpoint.latest_checkpoint(tmp_path).name == "step_000004"


@pytest.mark.parametrize("at_end", [True, False])
def test_the_final_checkpoint_is_saved_unless_switched_off(tmp_path, tokenizer, at_end):
    run_dir, _ = _run(tmp_path, tokenizer, ["train.steps=2", "log.checkpoint_every=0", f"log.checkpoint_at_end={at_end}",
                                            "eval.every=0", "eval.at_start=false"], f"end{at_end}")
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert saved == (["step_000002"] if at_end else [])
    assert len(read_metrics(run_dir / "metrics.jsonl")) == 2  # the metrics are written either way


def test_auto_engine_is_native_where_it_runs_the_model_and_hf_elsewhere(tokenizer, tiny_model, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    from turnrl.config import ConfigError, load_config
    from turnrl.engines import HFEngine
    from turnrl.engines.native import NativeEngine
    from turnrl.build import build

    auto = load_config(None, ["eval.at_start=false"])
    assert auto.rollout.engine == "auto"
    assert isinstance(build(auto, tiny_model, tokenizer).engine, NativeEngine)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tokenizer)))
    assert isinstance(build(auto, gpt2, tokenizer).engine, HFEngine)
    assert "generating with the HF engine" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="rollout.engine=native"):
        build(load_config(None, ["rollout.engine=native"]), gpt2, tokenizer)


def test_the_run_says_where_it_is_before_step_1_and_sums_up_at_the_end(tmp_path, tokenizer, capsys):
    run_dir, c = _run(tmp_path, tokenizer, ["rollout.engine=hf"], "told")
    err = capsys.readouterr().err
    head, tail = err.split("finished: 2 steps")
    for fact in (f"run        {run_dir}", "model", "env        parity-v0", "held-out   2 distinct tasks", "estimator  grpo_turn",
                 "engine     HFEngine", f"threads    {torch.get_num_threads()}", f"turnrl watch {run_dir}",
                 f"turnrl report {run_dir}"):
        assert fact in head, fact
    assert "held-out success: 0.000 (95% CI 0.000-0.658) at step 0 -> " in tail and "over 2 distinct held-out tasks" in tail
    assert "wall time" in tail and f"report: {run_dir / 'report.html'}" in tail
    assert "Writing model shards" not in err  # transformers' save bar is not the user's business


def test_loading_silences_transformers_chatter_and_nothing_else(caplog):
    import warnings

    from transformers.utils import logging as hf_logging

    from turnrl.build import quiet_transformers

    def load():  # what a load says: a transformers deprecation (logger and warning) and someone else's warning
        hf_logging.get_logger("transformers.configuration_utils").warning("`torch_dtype` is deprecated! Use `dtype` instead!")
        warnings.warn_explicit("old argument", FutureWarning, "modeling_utils.py", 1, module="transformers.modeling_utils")
        warnings.warn_explicit("a user's warning", UserWarning, "mine.py", 1, module="mypkg.mine")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_transformers():
            load()
        assert "torch_dtype" not in caplog.text and [str(w.message) for w in caught] == ["a user's warning"]
        caught.clear()
        load()  # outside the block, everything shows again
        assert "torch_dtype" in caplog.text and "old argument" in [str(w.message) for w in caught]


def _assert_diverged_cleanly(run_dir, tokenizer, error):
    """The run stopped with a failed status, an alert and a report; every checkpoint predates the step and is finite."""
    from turnrl import checkpoint
    from turnrl.models import tiny_model
    from turnrl.monitor.files import read_status

    diverged = read_metrics(run_dir / "metrics.jsonl")[-1]["step"]
    for k in checkpoint.checkpoints(run_dir):
        model = tiny_model(tokenizer, seed=0)
        checkpoint.load_weights(k, model)
        assert checkpoint.load_state(k)["step"] < diverged and checkpoint.non_finite_parameters(model) == []
    assert read_status(run_dir)["state"] == "failed" and "lower train.lr" in str(error).lower()
    alert = json.loads((run_dir / "alerts.jsonl").read_text().splitlines()[-1])
    assert alert["name"] == "non_finite_update" and alert["step"] == diverged and (run_dir / "report.html").exists()
    return diverged


@pytest.mark.probe("fault")
def test_an_update_to_non_finite_weights_stops_the_run_before_any_checkpoint_holds_them(tmp_path, tokenizer, monkeypatch):
    from turnrl.learner import Learner
    from turnrl.monitor.monitor import TrainingDiverged

    real, calls = Learner.update, []

    def poisoned_at_step_3(self, *args, **kwargs):
        metrics = real(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == 3:
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))
        return metrics

    monkeypatch.setattr(Learner, "update", poisoned_at_step_3)
    with pytest.raises(TrainingDiverged, match="non-finite weights") as e:
        _run(tmp_path, tokenizer, ["train.steps=4", "log.checkpoint_every=1", "log.keep_checkpoints=9"], "nan")
    assert _assert_diverged_cleanly(tmp_path / "nan", tokenizer, e.value) == 3
    assert (tmp_path / "nan" / "checkpoints" / "latest").read_text() == "step_000002"


def test_a_huge_learning_rate_stops_the_run_with_a_message(tmp_path, tokenizer):
    from turnrl.monitor.monitor import TrainingDiverged

    with pytest.raises(TrainingDiverged, match="non-finite") as e:
        _run(tmp_path, tokenizer, ["train.lr=1e30", "train.steps=4", "log.checkpoint_every=1", "log.keep_checkpoints=9",
                                   "algo.skip_zero_advantage=false"], "huge")
    _assert_diverged_cleanly(tmp_path / "huge", tokenizer, e.value)


class Broken(Parity):
    """Its server is gone: every step raises."""

    def step(self, action_text):
        raise ConnectionError("server closed the connection")


if "broken-v0" not in registered():
    register("broken-v0", Broken, description="test env whose steps fail")


@pytest.mark.probe("fault")
def test_a_run_whose_envs_all_fail_raises_an_alert(tmp_path, tokenizer):
    run_dir, _ = _run(tmp_path, tokenizer, ["env.id=broken-v0", "train.steps=1", "eval.at_start=false"], "broken")
    alerts = [json.loads(x) for x in (run_dir / "alerts.jsonl").read_text().splitlines()]
    assert [a["name"] for a in alerts] == ["env_failures"] and alerts[0]["step"] == 1
    trajectories = [json.loads(x) for x in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    assert "server closed the connection" in trajectories[0]["error"]


def test_held_out_tasks_are_distinct_and_never_trained_on_by_task_key(tmp_path, tokenizer, monkeypatch):
    """3x3 FrozenLake draws ~50 layouts, so seeds repeat maps: the seed ranges alone would overlap."""
    from turnrl.envs import make
    from turnrl.rollout import Collector

    calls = []
    real = Collector.collect

    def spy(self, seeds, group_size, sampling, env_id=""):
        calls.append((list(seeds), sampling.temperature == 0.0))
        return real(self, seeds, group_size, sampling, env_id)

    monkeypatch.setattr(Collector, "collect", spy)
    overrides = ["env.id=frozenlake-v0", "env.kwargs.size=3", "env.progress_reward=0", "rollout.tasks_per_step=4",
                 "train.steps=3", "eval.num_tasks=8", "eval.every=0", "log.checkpoint_every=0"]
    run_dir, _ = _run(tmp_path, tokenizer, overrides, "held")

    def key(seed):
        env = make("frozenlake-v0", size=3)
        env.reset(seed=seed)
        return env.task_key()

    eval_seeds = [s for seeds, greedy in calls if greedy for s in seeds]
    train_seeds = [s for seeds, greedy in calls if not greedy for s in seeds]
    eval_keys = [key(s) for s in eval_seeds[:8]]
    assert len(eval_seeds) == 16 and eval_seeds[:8] == eval_seeds[8:]  # the same 8 tasks at the start and the end
    assert len(set(eval_keys)) == 8
    assert len(train_seeds) == 12 and not {key(s) for s in train_seeds} & set(eval_keys)
    naive_eval = {key(1_000_000 + i) for i in range(8)}  # what seeds alone would have held out and trained on
    assert {key(s) for s in range(12)} & naive_eval
    rows = [json.loads(x) for x in (run_dir / "task_keys.jsonl").read_text().splitlines()]
    assert rows[0]["split"] == "eval" and [t["key"] for t in rows[0]["tasks"]] == eval_keys
    assert [t["seed"] for r in rows[1:] for t in r["tasks"]] == train_seeds and [r["step"] for r in rows[1:]] == [1, 2, 3]
    assert all(r["eval/distinct_tasks"] == 8.0 for r in read_metrics(run_dir / "metrics.jsonl") if "eval/success_rate" in r)


def _response_tokens(groups):
    return sum(len(turn.response_ids) for g in groups for t in g.trajectories for turn in t.turns)


def test_rollout_counters_cover_every_dynamic_sampling_round(tmp_path, tokenizer):
    from turnrl.build import sampling_params
    from turnrl.loop import collect_step

    cfg = load_config(None, TINY + [f"log.run_dir={tmp_path}", "algo.dynamic_sampling_rounds=3", "rollout.group_size=2"])
    from turnrl.models import tiny_model

    c = build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
    for step in range(4):
        _, collected, _, stats = collect_step(c, step, sampling_params(cfg))
        assert stats.generated_tokens == _response_tokens(collected)


def test_remax_greedy_baselines_do_not_replace_the_steps_rollout_counters(tmp_path, tokenizer):
    run_dir, _ = _run(tmp_path, tokenizer, ["algo.estimator=remax", "train.steps=1", "log.sample_trajectories=99",
                                            "eval.at_start=false", "eval.every=0"], "remax")
    rows = [json.loads(x) for x in (run_dir / "trajectories.jsonl").read_text().splitlines()]
    sampled = sum(len(turn["response_ids"]) for r in rows for turn in r["turns"])
    assert len(rows) == 4 and read_metrics(run_dir / "metrics.jsonl")[-1]["perf/generated_tokens"] == sampled


def test_an_env_with_a_single_task_has_no_held_out_split_and_says_so():
    from turnrl.build import TaskSplit, env_factories
    from turnrl.config import ConfigError

    cfg = load_config(None, ["env.kwargs.map_name=4x4", "eval.num_tasks=8"])  # one fixed map for every seed
    tasks = TaskSplit(cfg, *env_factories(cfg))
    assert len(tasks.eval_tasks) == 1
    with pytest.raises(ConfigError, match="no training task is left outside the held-out set"):
        tasks.train_tasks(0)


def test_training_ends_at_the_first_evaluation_that_reaches_eval_stop_at_success(tmp_path, tokenizer, monkeypatch):
    """Early stopping: the run ends after the evaluation whose held-out success reaches the bar, as finished."""
    import turnrl.loop
    from turnrl.monitor.files import read_status

    real = turnrl.loop.evaluate
    successes = iter([0.0, 0.25, 0.5, 1.0, 1.0])  # at steps 0, 2, 4, 6, 8

    def scripted(c):
        return real(c) | {"eval/success_rate": next(successes)}

    monkeypatch.setattr(turnrl.loop, "evaluate", scripted)
    run_dir, _ = _run(tmp_path, tokenizer, ["eval.every=2", "eval.stop_at_success=0.5"], "early", steps=8)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows[-1]["step"] == 4 and rows[-1]["eval/success_rate"] == 0.5  # not step 2 (0.25), not step 8
    status = read_status(run_dir)
    assert status["state"] == "finished" and "eval.stop_at_success" in status["message"], status
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000004"
