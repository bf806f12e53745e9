"""The step metrics the monitor logs: rollout statistics, the echo-trap similarity, the success interval."""

import pytest

from turnrl.monitor.metrics import cross_input_similarity, eval_metrics, wilson_interval
from turnrl.types import Trajectory, TrajectoryGroup, Turn


def test_cross_input_similarity_compares_first_responses_of_different_tasks():
    def group(seed, *responses):
        g = TrajectoryGroup(env_id="x", seed=seed)
        for r in responses:
            g.trajectories.append(Trajectory(env_id="x", seed=seed, turns=[Turn(prompt_ids=[0], response_ids=r, logprobs=[0.0] * len(r), observation="o", response_text="r")]))
        return g

    assert cross_input_similarity([group(0, [1, 2]), group(1, [1, 2])]) == 1.0
    assert cross_input_similarity([group(0, [1, 2], [5]), group(1, [2, 3], [6])]) == pytest.approx((1 / 3 + 0) / 2)
    assert cross_input_similarity([group(0, [1])]) is None


def test_wilson_interval_matches_the_closed_form_and_stays_in_range():
    lo, hi = wilson_interval(8, 10)
    assert (lo, hi) == pytest.approx((0.4902, 0.9433), abs=1e-4)  # the closed form of Wilson (1927)
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_eval_metrics_count_tasks_and_interval_over_groups():
    def episode(seed, success):
        t = Trajectory(env_id="x", seed=seed, turns=[Turn([0], [1], [0.0], "o", "r", reward=float(success))], success=success)
        return TrajectoryGroup("x", seed, [t])

    m = eval_metrics([episode(i, i < 3) for i in range(4)], seconds=1.5)
    assert m["eval/success_rate"] == 0.75 and m["eval/num_tasks"] == 4.0 and m["perf/eval_s"] == 1.5
    assert (m["eval/success_ci_low"], m["eval/success_ci_high"]) == wilson_interval(3, 4)


def test_eval_interval_counts_each_distinct_task_once():
    def episode(seed, key, success):
        t = Trajectory(env_id="x", seed=seed, turns=[Turn([0], [1], [0.0], "o", "r")], success=success, task_key=key)
        return TrajectoryGroup("x", seed, [t])

    # five seeds, three tasks: "a" drawn three times (all solved), "b" and "c" once each (failed)
    groups = [episode(0, "a", True), episode(1, "a", True), episode(2, "b", False), episode(3, "a", True),
              episode(4, "c", False)]
    m = eval_metrics(groups, seconds=1.0)
    assert m["eval/distinct_tasks"] == 3.0 and m["eval/num_tasks"] == 5.0
    assert (m["eval/success_ci_low"], m["eval/success_ci_high"]) == wilson_interval(1, 3)
    assert m["eval/success_rate"] == 0.6  # the episode mean is still reported as it is
