"""bench/multiagent.py's hierarchy arm: the steps ratio, and two sides trained in two processes read back as one."""

import json
import random

from tests.bench_modules import load_bench


def bench_module():
    return load_bench("multiagent")


def test_the_steps_ratio_is_the_first_step_the_hierarchy_reaches_flats_final_success_over_flats_steps():
    steps_ratio = bench_module().steps_ratio
    flat = [(0, 0.1), (4, 0.3), (8, 0.2), (20, 0.25)]
    assert steps_ratio(flat, [(0, 0.0), (4, 0.2), (8, 0.25), (12, 0.5)])[0] == 8 / 20
    ratio, note = steps_ratio(flat, [(0, 0.0), (4, 0.2)])
    assert ratio is None and "never reached" in note and "0.200" in note
    ratio, note = steps_ratio([(0, 0.2), (20, 0.2)], [(0, 0.0), (4, 0.9)])
    assert ratio is None and "did not improve" in note


def side(curve, success):
    row = {"success": success, "ci95": [0.0, 1.0], "distinct_tasks": 32}
    return {"sft": {**row, "success": curve[0][1]}, "trained": row, "curve": curve, "milestone_per_step": [], "seconds": 1.0}


def test_sides_saved_by_two_processes_are_read_back_and_a_missing_one_is_not_guessed(tmp_path):
    bench = bench_module()
    budget = {"hier_side": "none", "hier_dir": str(tmp_path), "steps": 20}
    flat = side([(0, 0.1), (10, 0.2), (20, 0.3)], 0.3) | {"baselines": {"random": {"success": 0.0, "ci95": [0, 0.1],
                                                                                     "distinct_tasks": 32}}}
    (tmp_path / "flat.json").write_text(json.dumps(flat))
    assert bench.hier_arm(budget, str(tmp_path), {}, random.Random(0)) == {}  # the hierarchy's side is not there yet
    (tmp_path / "hier.json").write_text(json.dumps(side([(0, 0.0), (4, 0.1), (8, 0.35), (12, 0.4)], 0.4)))
    out = bench.hier_arm(budget, str(tmp_path), {}, random.Random(0))
    assert out["hier_steps_ratio"] == 8 / 20
    assert out["hier"]["flat_curve"][-1] == (20, 0.3) and out["hier"]["sft_hier"]["success"] == 0.0
    assert out["hier"]["random"]["success"] == 0.0 and "reached 0.300 at step 8" in out["hier"]["ratio_note"]


def test_rl_from_an_sft_start_keeps_the_other_train_keys_and_starts_past_the_demonstrated_tasks(tmp_path):
    from types import SimpleNamespace

    bench = bench_module()
    run = SimpleNamespace(model_path=tmp_path / "model", next_seed=166)
    extra = {"train": {"threads": 1, "seed": 2}, "env": {"progress_reward": 0.2}}
    start = bench.from_sft(run, extra)
    assert start == {"model": {"path": str(tmp_path / "model")}, "train": {"threads": 1, "seed": 2, "seed_start": 166}}
    cfg = bench.config("relay-v0", {"tasks": 2, "group": 2, "steps": 3, "eval_tasks": 4}, str(tmp_path), {**extra, **start})
    assert (cfg.train.seed_start, cfg.train.threads, cfg.train.seed, cfg.train.steps) == (166, 1, 2, 3)
    assert cfg.env.progress_reward == 0.2 and cfg.model.path == str(tmp_path / "model")
