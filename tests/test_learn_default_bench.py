"""bench/learn_default.py --speed: seconds to the bar from a run's metrics, and the ratio of two sides."""

import pytest

from tests.bench_modules import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("learn_default")


def _rows(successes, wall_per_step=100.0):
    """Metrics of a run evaluated every 5 steps with these held-out successes (valid actions always)."""
    rows = []
    for step in range(1, 5 * (len(successes) - 1) + 1):
        rows.append({"step": step, "perf/train_s": 60.0, "perf/rollout_s": 40.0, "rollout/valid_action_rate": 1.0})
    evals = [{"step": 5 * i, "eval/success_rate": s, "perf/wall_s": 5 * i * wall_per_step} for i, s in enumerate(successes)]
    del evals[0]["perf/wall_s"]  # the step-0 evaluation runs before the clock the steps report
    return rows + evals, evals


def test_seconds_to_the_bar_is_the_first_evaluation_30_points_above_the_start(bench):
    rows, evals = _rows([0.0, 0.1, 0.35, 0.5])
    f = bench.speed_fields(rows, evals, setup_s=20.0)
    assert f["seconds_to_bar"] == 1000 + 20 and f["seconds_run"] == 1500 + 20
    rows, evals = _rows([0.0, 0.1, 0.2])
    f = bench.speed_fields(rows, evals, setup_s=20.0)
    assert f["seconds_to_bar"] is None and f["seconds_run"] == 1000 + 20


def test_a_side_that_never_reached_the_bar_bounds_the_ratio_and_is_not_guessed(bench):
    reached = [{"seconds_to_bar": 600.0, "seconds_run": 600.0}, {"seconds_to_bar": 800.0, "seconds_run": 800.0}]
    assert bench.time_ratios(reached, [{"seconds_to_bar": 350.0, "seconds_run": 350.0}] * 2) == (700.0, 350.0, 0.5, None)
    never = [{"seconds_to_bar": None, "seconds_run": 3000.0}, {"seconds_to_bar": 900.0, "seconds_run": 900.0}]
    old_s, new_s, ratio, at_most = bench.time_ratios(never, reached)
    assert old_s is None and ratio is None and at_most == pytest.approx(700.0 / 900.0)
    assert bench.time_ratios(reached, never) == (700.0, None, None, None)  # the new side failed: nothing is bounded


def test_the_warm_step_ratio_is_the_per_step_part_of_the_time_ratio(bench):
    today = [{"warm_step_s": 100.0}, {"warm_step_s": 120.0}, {"warm_step_s": None}]
    new = [{"warm_step_s": 50.0}, {"warm_step_s": 90.0}, {"warm_step_s": 40.0}]
    assert bench.warm_step_ratio(today, new) == pytest.approx((0.5 + 0.75) / 2)  # per seed, then the median
    assert bench.warm_step_ratio([{"warm_step_s": None}], [{"warm_step_s": 1.0}]) is None
