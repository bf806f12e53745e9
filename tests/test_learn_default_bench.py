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


def test_the_warm_step_ratio_compares_the_steps_both_sides_ran_per_token(bench):
    # today ran 4 steps and its later ones got cheap (a trained policy walks fewer turns); new stopped at step 2
    today = [{"warm_step_s": 60.0, "step_seconds_per_token": {"0": 9.0, "1": 4.0, "2": 4.0, "3": 1.0, "4": 1.0}}]
    new = [{"warm_step_s": 60.0, "step_seconds_per_token": {"0": 9.0, "1": 2.0, "2": 3.0}}]
    assert bench.warm_step_ratio(today, new) == pytest.approx((0.5 + 0.75) / 2)  # steps 1 and 2; not 1.0
    rows, evals = _rows([0.0, 0.5])
    per_token = bench.speed_fields(rows, evals, setup_s=0.0)["step_seconds_per_token"]
    assert sorted(per_token, key=int) == [str(s) for s in range(1, 6)] and per_token["1"] == pytest.approx(100.0)


def test_keep_previous_takes_the_other_seeds_of_a_run_with_the_same_sides(bench, tmp_path):
    import argparse
    import json

    runs = {"today": [{"seconds_to_bar": 1.0}, {"seconds_to_bar": 2.0}], "new": [{"seconds_to_bar": 3.0}, {"seconds_to_bar": 4.0}]}
    perf = tmp_path / "perf.json"
    perf.write_text(json.dumps({"learn_speed": {"old_overrides": "a=1", "new_overrides": "", "bar_stop_at_success": 0.3,
                                                "threads_per_side": 1, "seeds": [0, 1], "runs": runs}}))
    args = argparse.Namespace(old="a=1", new="", bar=0.3, threads=1, seeds=[1, 2])
    prev = bench.earlier_runs(perf, args)
    assert prev == {"today": [{"seconds_to_bar": 1.0}], "new": [{"seconds_to_bar": 3.0}], "seeds": [0]}  # seed 1 reruns
    with pytest.raises(SystemExit, match="not this invocation's"):
        bench.earlier_runs(perf, argparse.Namespace(old="", new="", bar=0.3, threads=1, seeds=[1]))
