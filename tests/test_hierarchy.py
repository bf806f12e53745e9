"""Hierarchy: planner / executor envs (8x8 FrozenLake, two-box Sokoban), milestone and hindsight rewards, RewardFlow."""

import json
import math

import pytest

from turnrl.agent import ContextSpec
from turnrl.engines import SamplingParams
from turnrl.envs import check_env, make
from turnrl.envs.hierarchy import EXECUTOR, PLANNER, FrozenLakeSubgoals, Hierarchy, SokobanSubgoals
from turnrl.envs.sokoban import Puzzle
from turnrl.credit.rewardflow import SUCCESS, apply_rewardflow, shaped_rewards, state_values
from turnrl.rollout.multiagent import MultiAgentCollector
from turnrl.types import Termination, Trajectory, TrajectoryGroup, Turn

from tests.test_multiagent import ScriptedEngine

OPEN = ["SFFF", "FFFF", "FFHF", "FFFG"]  # a fixed map: one hole at row 2, column 2


def lake(every=2, **kw):
    env = make("frozenlake-v0", desc=OPEN, max_turns=kw.pop("executor_turns", 12))
    h = Hierarchy(env, FrozenLakeSubgoals(env.unwrapped), every=every, **kw)
    h.reset(seed=0)
    return h


def step(env, role, text):
    assert env.acting() == (role,)
    return env.step({role: text})


@pytest.mark.parametrize("env_id", ["frozenlake-8x8-v0", "frozenlake-hier-v0", "sokoban-hier-v0"])
def test_long_horizon_envs_pass_check_env(env_id):
    check_env(env_id, seeds=range(4), random_tasks=True)


def test_the_hierarchy_holds_out_the_flat_envs_tasks_and_its_oracle_team_solves_them():
    flat, hier = make("frozenlake-8x8-v0"), make("frozenlake-hier-v0")
    solved = 0
    for seed in range(20):
        flat.reset(seed=seed)
        hier.reset(seed=seed)
        assert hier.task_key() == flat.task_key() and len(flat.task_key().split("/")) == 8
        while hier.acting():
            role = hier.acting()[0]
            out = hier.step({role: hier.oracle(role)})
        solved += out.infos[PLANNER]["success"] and out.infos[EXECUTOR]["success"]
    assert solved == 20


def test_the_sokoban_oracle_team_fills_both_targets():
    env = make("sokoban-hier-v0")
    for seed in range(5):
        env.reset(seed=seed)
        assert len(env.unwrapped.env.unwrapped.puzzle.boxes) == 2
        milestones = 0.0
        while env.acting():
            role = env.acting()[0]
            out = env.step({role: env.oracle(role)})
            milestones += out.infos[EXECUTOR]["reward_components"].get("milestone", 0.0)
        assert out.infos[EXECUTOR]["success"] and milestones >= 2 * 0.5  # each box on its target was a milestone


def test_sokoban_subgoals_are_empty_targets_and_filling_one_is_a_milestone():
    env = make("sokoban-v0", max_turns=12)
    h = Hierarchy(env, SokobanSubgoals(env.unwrapped), every=4)
    h.reset(seed=0)
    env.unwrapped.puzzle = Puzzle.parse(["######", "#P___#", "#_X_O#", "#_X_O#", "#____#", "######"])
    out = step(h, PLANNER, "BOX 1 1")
    assert not out.infos[PLANNER]["valid"] and "not an empty target" in out.observations[PLANNER]
    out = step(h, PLANNER, "BOX 2 4")
    assert "push a box onto the target at row 2, column 4 (1 down, 3 right of P)" in out.observations[EXECUTOR]
    assert h.oracle(EXECUTOR) == "Down"
    for move in ["Down", "Right"]:
        assert step(h, EXECUTOR, move).rewards[EXECUTOR] == 0.0
    out = step(h, EXECUTOR, "Right")
    assert out.infos[EXECUTOR]["reward_components"] == {"outcome": 0.0, "milestone": 0.5} and h.acting() == (PLANNER,)
    assert not out.infos[EXECUTOR]["success"] and "The executor reached subgoal 2 4." in out.observations[PLANNER]


def test_planner_subgoals_are_verified_and_invalid_ones_change_nothing():
    env = lake()
    for text, why in [("go somewhere", "No subgoal"), ("GOAL 2 2", "hole"), ("GOAL 9 1", "off the map"), ("GOAL 0 0", "already")]:
        out = step(env, PLANNER, text)
        assert not out.infos[PLANNER]["valid"] and why in out.observations[PLANNER] and env.acting() == (PLANNER,)
    out = step(env, PLANNER, "GOAL 1 2")
    assert out.infos[PLANNER]["valid"] and out.infos[PLANNER]["actions"] == ["GOAL 1 2"]
    assert "Subgoal: reach row 1, column 2 (1 down, 2 right)" in out.observations[EXECUTOR]
    assert env.anchor(EXECUTOR) == env.anchor(PLANNER) + "|subgoal 1 2"


def test_reaching_the_subgoal_pays_a_milestone_and_returns_to_the_planner():
    env = lake(every=4, milestone_reward=0.5)
    step(env, PLANNER, "GOAL 1 1")
    out = step(env, EXECUTOR, "Down")
    assert out.rewards == {PLANNER: 0.0, EXECUTOR: 0.0} and env.acting() == (EXECUTOR,)
    out = step(env, EXECUTOR, "banana")  # invalid: no move, not counted towards the segment
    assert not out.infos[EXECUTOR]["valid"] and env.segment_turns == 1
    out = step(env, EXECUTOR, "Right")
    assert out.infos[EXECUTOR]["reward_components"] == {"outcome": 0.0, "milestone": 0.5}
    assert out.rewards == {PLANNER: 0.0, EXECUTOR: 0.5} and env.acting() == (PLANNER,)
    assert "reached subgoal 1 1" in out.observations[PLANNER]


def test_a_missed_segment_is_relabelled_and_paid_only_when_it_made_progress():
    env = lake(every=2, milestone_reward=0.5, hindsight_reward=0.25)
    step(env, PLANNER, "GOAL 0 3")
    step(env, EXECUTOR, "Down")
    out = step(env, EXECUTOR, "Down")  # missed 0 3 after 2 turns, but 2 0 is 2 moves nearer the goal
    assert out.infos[EXECUTOR]["reward_components"] == {"outcome": 0.0, "hindsight": 0.25}
    assert "missed subgoal 0 3 but got to 2 0" in out.observations[PLANNER] and env.acting() == (PLANNER,)
    step(env, PLANNER, "GOAL 3 1")
    step(env, EXECUTOR, "Up")
    out = step(env, EXECUTOR, "Down")  # back where the segment began: no progress, no reward
    assert out.infos[EXECUTOR]["reward_components"] == {"outcome": 0.0} and "no closer" in out.observations[PLANNER]


def test_the_outcome_goes_to_both_roles_and_ends_both():
    env = lake(every=8)
    step(env, PLANNER, "GOAL 3 3")
    for move in ["Down", "Down", "Down", "Right", "Right"]:
        step(env, EXECUTOR, move)
    out = step(env, EXECUTOR, "Right")
    assert out.rewards == {PLANNER: 1.0, EXECUTOR: 1.5} and all(out.terminated.values()) and env.acting() == ()
    assert out.infos[PLANNER]["success"] and out.infos[EXECUTOR]["reward_components"]["milestone"] == 0.5


@pytest.mark.parametrize("env_id", ["frozenlake-hier-v0", "sokoban-hier-v0"])
def test_progress_shaping_reaches_both_roles_through_the_env_it_wraps(env_id):
    """env.progress_reward on a hierarchy shapes the env it wraps (a multi-agent env refuses it otherwise): each
    executor move's progress component goes to the planner too, and the oracle team earns as much as its moves."""
    env = make(env_id, max_turns=40, progress_reward=0.2)
    env.reset(seed=3)
    totals = {PLANNER: 0.0, EXECUTOR: 0.0}
    moves = 0
    while env.acting():
        role = env.acting()[0]
        out = env.step({role: env.oracle(role)})
        moves += role == EXECUTOR
        for r in totals:
            totals[r] += out.infos[r]["reward_components"].get("progress", 0.0)
    assert out.infos[EXECUTOR]["success"]
    assert totals[PLANNER] == totals[EXECUTOR] == pytest.approx(0.2 * moves)  # every oracle move is one step closer


def test_the_executors_turn_limit_truncates_both_roles():
    env = lake(every=8, executor_turns=2)
    step(env, PLANNER, "GOAL 3 3")
    step(env, EXECUTOR, "Right")
    out = step(env, EXECUTOR, "Left")
    assert all(out.truncated.values()) and not any(out.terminated.values())
    assert out.infos[PLANNER]["truncation"] == "turns" and env.acting() == ()


def test_each_role_sees_its_own_prompt_and_milestones_reach_the_trajectories(tokenizer):
    def respond(prompt, _):
        last = prompt.rsplit("user", 1)[-1]
        if "Set the next subgoal" in last:
            return "GOAL 3 3"
        offset = last.rsplit("Subgoal:", 1)[-1]
        return "Down" if "down" in offset else "Right"

    collector = MultiAgentCollector(ScriptedEngine(tokenizer, respond), tokenizer, lambda: lake(every=8), ContextSpec())
    planner, executor = collector.collect([0], 2, SamplingParams(max_new_tokens=8))
    assert [g.trajectories[0].agent for g in (planner, executor)] == [PLANNER, EXECUTOR]
    for traj in executor.trajectories:
        assert traj.success and traj.reward_components["milestone"] == 0.5 and traj.total_reward == 1.5
        assert "You are the executor" in tokenizer.decode(traj.turns[0].prompt_ids)
    assert all(t.total_reward == 1.0 and "You are the planner" in tokenizer.decode(t.turns[0].prompt_ids)
               for t in planner.trajectories)


# ---------------------------------------------------------------------------------------------- RewardFlow


def traj(anchors, success=False, termination=Termination.TERMINATED):
    t = Trajectory(env_id="x", seed=0, turns=[Turn([], [1], [0.0], "", "", anchor=a) for a in anchors],
                   termination=termination, success=success)
    return t


def test_state_values_are_the_decayed_distance_to_success_over_the_groups_graph():
    # a -> b -> c succeeds; a -> d -> b: d reaches success only through b, which another copy saw; e is a dead end
    group = [traj(["a", "b", "c"], success=True), traj(["a", "d", "b"], termination=Termination.TRUNCATED_TURNS),
             traj(["a", "e"])]
    v = state_values(group, gamma=0.5)
    assert v == {SUCCESS: 1.0, "c": 0.5, "b": 0.25, "a": 0.125, "d": 0.125}
    assert shaped_rewards(group[0], v, 0.5) == [0.0, 0.0, 0.0]  # a shortest way to success
    assert shaped_rewards(group[1], v, 0.5) == [0.5 * 0.125 - 0.125, 0.5 * 0.25 - 0.125, 0.5 * 0.25 - 0.25]
    assert shaped_rewards(group[2], v, 0.5) == [0.0 - 0.125, 0.0]  # into a dead end; a failed ending is worth 0


def test_shaping_telescopes_over_an_episode():
    group = [traj(["a", "b", "a", "b", "c"], success=True), traj(["a", "c"], success=True)]
    gamma = 0.8
    v = state_values(group, gamma)
    for t in group:
        f = shaped_rewards(t, v, gamma)
        discounted = sum(gamma**k * x for k, x in enumerate(f))
        assert math.isclose(discounted, gamma ** len(f) * 1.0 - v["a"])


def test_apply_rewardflow_adds_a_named_component_and_refuses_turns_without_anchors():
    group = TrajectoryGroup("x", 0, [traj(["a", "b"], success=True), traj(["a", "a", "b"], success=True)])
    apply_rewardflow([group], weight=2.0, gamma=0.5)
    looped = group.trajectories[1]
    assert looped.turns[0].reward_components["rewardflow"] == 2.0 * (0.5 * 0.25 - 0.25)  # a self-loop costs
    assert looped.turns[0].reward == looped.turns[0].reward_components["rewardflow"]
    with pytest.raises(ValueError, match="no anchor"):
        apply_rewardflow([TrajectoryGroup("x", 0, [traj([None])])], 1.0, 0.5)
    with pytest.raises(ValueError, match="gamma"):
        state_values([], 1.0)


def test_a_hierarchy_training_run_with_rewardflow_logs_its_component(tmp_path, tokenizer, tiny_model):
    from turnrl.build import build
    from turnrl.config import Config
    from turnrl.loop import train

    cfg = Config.model_validate({
        "env": {"id": "frozenlake-hier-v0", "max_turns": 4, "progress_reward": 0.0, "kwargs": {"size": 4}},
        "rollout": {"engine": "hf", "tasks_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "algo": {"skip_zero_advantage": False}, "hierarchy": {"rewardflow": 0.5}, "train": {"steps": 1},
        "eval": {"num_tasks": 2}, "log": {"run_dir": str(tmp_path), "checkpoint_at_end": False}})
    run = train(cfg, components=build(cfg, model=tiny_model, tokenizer=tokenizer))
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["step"] == 1 and last["rollout/collected_groups"] == 4 and "rollout/reward/rewardflow" in last
