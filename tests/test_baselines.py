"""bench/baselines.py: the oracle solves what it claims to, random and rule episodes are well formed, and the runner
plays exactly the held-out tasks of the run's split. No model: envs only."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import baselines  # noqa: E402

from turnrl.build import TaskSplit, env_factories  # noqa: E402
from turnrl.config import load_config  # noqa: E402
from turnrl.envs import Env  # noqa: E402
from turnrl.types import Termination  # noqa: E402

CONFIGS = ["default", "frozenlake_raw", "sokoban", "countdown", "sql", "searchqa", "webshop", "code"]
FEW = ["eval.num_tasks=4"]


def config(name: str, overrides: list[str] = FEW):
    return load_config(ROOT / "configs" / f"{name}.yaml", overrides)


def episodes(cfg, policy_name: str, cap: baselines.Cap | None = None):
    split, factory, env_id = baselines.held_out(cfg)
    probe = factory()
    policy = baselines.policies_for(probe)[policy_name]
    probe.close()
    groups = baselines.run_policy(factory, split.eval_tasks, policy, cap or baselines.Cap(), env_id)
    return split, [g.trajectories[0] for g in groups]


@pytest.mark.parametrize("name", CONFIGS)
def test_oracle_solves_every_task_it_has_a_plan_for(name):
    cfg = config(name)
    split, trajs = episodes(cfg, "oracle")
    factory = split.eval_envs
    for task, traj in zip(split.eval_tasks, trajs):
        env = factory()
        env.reset(seed=task.seed)
        claims = env.solve() is not None
        env.close()
        assert claims, f"{name} seed {task.seed}: the oracle has no plan for a held-out task"
        assert traj.success, f"{name} seed {task.seed}: the oracle's plan did not solve it ({traj.termination}, {traj.error})"
        assert traj.termination == Termination.TERMINATED
        assert all(t.valid for t in traj.turns)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("policy", ["random", "rule"])
def test_random_and_rule_episodes_are_well_formed(name, policy):
    cfg = config(name)
    split, trajs = episodes(cfg, policy)
    assert [t.seed for t in trajs] == [t.seed for t in split.eval_tasks]
    for task, traj in zip(split.eval_tasks, trajs):
        assert traj.termination != Termination.ENV_ERROR, traj.error
        assert traj.task_key == task.key
        assert 1 <= len(traj.turns) <= cfg.env.max_turns
        assert all(turn.response_text for turn in traj.turns)
        if traj.termination == Termination.TRUNCATED_TURNS:
            assert len(traj.turns) == cfg.env.max_turns


def test_rules_act_validly_where_a_simple_rule_can():
    """The rules' actions parse: a rule that spoke a format the env does not read would be no baseline at all."""
    for name in ["default", "frozenlake_raw", "sokoban", "countdown", "sql", "searchqa", "webshop"]:
        _, trajs = episodes(config(name), "rule")
        assert all(turn.valid for t in trajs for turn in t.turns), name


def test_frozenlake_hint_rule_follows_the_hint():
    seen = baselines.Seen(None, ["PFFF\nHHFH\nFFFH\nHFFG\nLeft: wall, Down: hole, Right: frozen, Up: wall"], None)
    assert baselines.frozenlake_hint_rule(seen) == "Right"
    seen.observations.append("FPFF\nHFFH\nFFFH\nHFFG\nLeft: frozen, Down: frozen, Right: frozen, Up: wall")
    assert baselines.frozenlake_hint_rule(seen) == "Down"


def test_sokoban_rule_walks_behind_the_box_then_pushes():
    grid = "# # # # #\n# P _ _ #\n# _ X _ #\n# _ O _ #\n# # # # #"  # the box must go down: stand above it
    seen = baselines.Seen(None, [grid], None)
    assert baselines.sokoban_push_rule(seen) == "Right"
    seen.observations.append("# # # # #\n# _ P _ #\n# _ X _ #\n# _ O _ #\n# # # # #")
    assert baselines.sokoban_push_rule(seen) == "Down"


def test_runner_tasks_are_the_split_eval_tasks():
    cfg = config("default", ["eval.num_tasks=16"])
    split = TaskSplit(cfg, *env_factories(cfg))
    ours, trajs = episodes(cfg, "rule")
    assert ours.eval_tasks == split.eval_tasks
    assert [(t.seed, t.task_key) for t in trajs] == [(t.seed, t.key) for t in split.eval_tasks]
    assert len({t.key for t in split.eval_tasks}) == 16


def test_responses_are_cut_to_the_turn_token_limit(tokenizer):
    cfg = config("webshop", ["eval.num_tasks=2", "rollout.max_new_tokens=3"])
    _, trajs = episodes(cfg, "rule", baselines.Cap(tokenizer, cfg.rollout.max_new_tokens))
    first = trajs[0].turns[0]
    assert first.finish_reason == "length" and len(first.response_ids) == 3
    assert not first.valid  # a search cut before its closing bracket is no action


def test_measure_rows_carry_success_interval_and_task_count():
    rows = baselines.measure(config("frozenlake_raw", ["eval.num_tasks=8"]), ("random", "oracle"))
    assert rows["oracle"]["success"] == 1.0 and rows["oracle"]["distinct_tasks"] == 8
    lo, hi = rows["oracle"]["ci95"]
    assert 0.6 < lo < 1.0 and hi == 1.0
    assert rows["random"]["success"] < rows["oracle"]["success"]


def test_an_env_without_rules_is_refused_by_name():
    class Guess(Env):
        pass

    with pytest.raises(ValueError, match="no baseline policies for Guess"):
        baselines.policies_for(Guess())


def test_vs_trl_holds_out_maps_neither_side_trains_on():
    """bench/vs_trl.py used eval seeds 1,000,000.. and training seeds 0..31: 57 distinct maps, 7 of them trained on."""
    import vs_trl

    from turnrl.build import task_keys

    args = Namespace(steps=8, tasks=4, eval_tasks=64)
    held, trained = vs_trl.seeds(args)
    factory = env_factories(vs_trl.task_config(args))[0]
    held_keys = {t.key for t in task_keys(factory, held)}
    assert len(held) == len(held_keys) == 64
    assert len(trained) == args.steps * args.tasks
    assert not held_keys & {t.key for t in task_keys(factory, trained)}
