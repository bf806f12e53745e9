"""bench/agents.py's helpers: each env's config is the issue's env, the held-out check catches a demonstration on a
held-out task, and the targets count only what the numbers show. No model: configs and envs only."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import agents  # noqa: E402
from baselines import held_out  # noqa: E402

SMOKE = Namespace(smoke=True, eval_tasks=4, sft_steps=0, overrides=[])


def test_each_env_is_the_issues_env_under_the_smoke_budget():
    cfgs = {env: agents.env_config(env, SMOKE) for env in agents.ENVS}
    assert {c.env.id for c in cfgs.values()} == {"frozenlake-v0", "sokoban-v0", "searchqa-v0", "webshop-v0", "sql-v0",
                                                   "countdown-v0", "code-v0"}
    assert cfgs["frozenlake_raw"].env.kwargs == {"show_hints": False}
    assert cfgs["sokoban"].env.kwargs == {"show_hints": True, "size": 5, "num_boxes": 1}  # 5x5, one box; the hint line
    assert all(c.eval.num_tasks == 4 and c.sft.steps == 2 and c.train.steps == 1 and c.sft.demos == "oracle"
               for c in cfgs.values())
    full = agents.env_config("countdown", Namespace(smoke=False, eval_tasks=0, sft_steps=7, overrides=["train.seed=3"]))
    assert full.sft.steps == 7 and full.eval.num_tasks == 64 and full.train.seed == 3


def test_a_demonstration_on_a_held_out_task_is_counted(tmp_path):
    cfg = agents.env_config("frozenlake_raw", SMOKE)
    split, _, _ = held_out(cfg)
    train_seeds = [t.seed for t in split.train_tasks(0)]
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps({"seed": s}) + "\n" for s in train_seeds))
    assert agents.demo_overlap(cfg, demos) == 0
    demos.write_text("".join(json.dumps({"seed": s}) + "\n" for s in [*train_seeds, split.eval_tasks[0].seed]))
    assert agents.demo_overlap(cfg, demos) == 1


def _record(env: str, base: float, sft: float, sft_rl: float, ci: list[float]) -> dict:
    return {"env": env, "base": base, "sft": sft, "sft_rl": sft_rl, "ci95_sft_rl": ci}


def test_targets_count_gains_and_rl_only_beyond_its_interval():
    records = [_record("a", 0.0, 0.3, 0.5, [0.35, 0.65]),   # +0.5 over base; RL +0.2, interval above SFT
               _record("b", 0.1, 0.3, 0.4, [0.25, 0.55]),   # +0.3 over base; RL +0.1 but SFT inside the interval
               _record("sokoban", 0.0, 0.1, 0.3, [0.05, 0.45])]
    [(_, gain_met, gain), (_, rl_met, rl), (_, soko_met, soko)] = agents.targets(records)
    assert not gain_met and gain.startswith("3 of 3 run")
    assert not rl_met and rl == "1 of 3 run: ['a']"
    assert soko_met and soko == "0.300"
    assert agents.targets(records[:1])[2] == ("Sokoban held-out greedy success >= 0.30", False, "Sokoban not run")


def test_the_demo_table_compares_the_two_rl_arms_only_where_both_ran():
    ci = {k: [0.0, 1.0] for k in ("sft", "sft_rl", "demo_rl")}
    guided = {"env": "frozenlake_raw", "sft": 0.25, "sft_rl": 0.3, "demo_rl": 0.45, "ci95": ci, "rl_steps": 9,
              "demo_rl_steps": 8, "demo_coef": 0.1}
    assert agents.demo_table([]) == []
    lines = agents.demo_table([guided])
    row = lines[-1].split(" | ")
    assert row[0] == "| frozenlake_raw" and row[4] == "+0.150" and row[5] == "9 / 8"
    assert "same SFT checkpoint" in lines[1]


def test_a_merge_names_each_records_own_run(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench/agents.py", "--resume", "--out", "/tmp/merged"])
    mine = {"env": "code", "source": agents.source()}
    other = {"env": "sokoban", "source": {"command": "python bench/agents.py --envs sokoban", "date": "2026-12-07 05:38",
                                          "commit": "abd3fe1", "cpu": "AMD EPYC"}}
    assert mine["source"]["command"] == "python bench/agents.py --resume --out /tmp/merged"
    assert agents.provenance([mine]) == []
    lines = agents.provenance([mine, other, {"env": "sql"}])
    assert lines[-2] == "- sokoban: `python bench/agents.py --envs sokoban` (2026-12-07 05:38, commit abd3fe1, AMD EPYC)"
    assert lines[-1].startswith("- sql: no source recorded")


def test_rl_overrides_reach_the_rl_part_only(monkeypatch, tmp_path):
    """``--rl`` changes the RL arm alone: SFT's config (its demonstrations, the base model's evaluation) stays the
    recipe's, and the record says which overrides the RL arm ran with."""
    row = {"eval/success_rate": 0.5, "eval/success_ci_low": 0.2, "eval/success_ci_high": 0.8, "eval/distinct_tasks": 4,
           "eval/reward": 0.5, "eval/valid_action_rate": 1.0, "eval/turns": 3.0, "eval/response_truncated_rate": 0.0,
           "perf/eval_s": 1.0, "step": 2}
    seen: dict[str, object] = {}

    def fake_sft(env, args, run_root, minutes):
        seen["sft_cfg"] = agents.env_config(env, args)
        return Namespace(before=row, after=row, next_seed=64, model_path=tmp_path, run_dir=tmp_path, num_demos=4, steps=2)

    def fake_rl(env, args, run_root, model_path, minutes, extra=(), name="rl"):
        seen["rl_extra"] = extra
        return row, tmp_path, 8

    fixed = agents.summary(row)
    monkeypatch.setattr(agents, "measure", lambda cfg, tokenizer: dict.fromkeys(("random", "rule", "oracle"), fixed))
    monkeypatch.setattr("turnrl.models.load_tokenizer", lambda path: None)
    monkeypatch.setattr(agents, "run_sft", fake_sft)
    monkeypatch.setattr(agents, "run_rl", fake_rl)
    args = Namespace(**vars(SMOKE), rl=["curriculum.enabled=true", "curriculum.levels=[{use: 2},{use: 4}]"],
                     out=tmp_path, minutes=30.0, sft_share=0.5, demo_guided=False, keep=True)
    record = agents.run_env("countdown", args)
    assert seen["rl_extra"] == ("train.seed_start=64", *args.rl)
    assert not seen["sft_cfg"].curriculum.enabled
    assert record["rl_overrides"] == args.rl and record["rl_seed_start"] == 64
    cfg = agents.env_config("countdown", SMOKE, seen["rl_extra"])
    assert cfg.curriculum.enabled and cfg.curriculum.level_kwargs() == [{"use": 2}, {"use": 4}]


def test_under_a_curriculum_each_demonstration_is_checked_at_its_own_level(tmp_path):
    levels = ("curriculum.enabled=true", "curriculum.levels=[{num_numbers: 2},{num_numbers: 4}]", "sft.demo_levels=all")
    cfg = agents.env_config("countdown", SMOKE, levels)
    split, _, _ = held_out(cfg)
    from turnrl.envs import make

    two = [make("countdown-v0", num_numbers=2) for _ in range(3)]
    rows = [{"seed": s, "task_key": env.reset(seed=s)[1]["task"]} for s, env in zip(range(3), two)]
    held = split.eval_tasks[0]
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert agents.demo_overlap(cfg, demos) == 0
    demos.write_text("".join(json.dumps(r) + "\n" for r in [*rows, {"seed": held.seed, "task_key": held.key}]))
    assert agents.demo_overlap(cfg, demos) == 1  # a 4-number demonstration on a held-out puzzle
    demos.write_text(json.dumps({"seed": 0, "task_key": "1 2 -> 3"}) + "\n")
    with pytest.raises(SystemExit, match="no curriculum level's task"):
        agents.demo_overlap(cfg, demos)


def test_the_cpu_names_its_matmul_instructions(monkeypatch, tmp_path):
    """One model name covers machines of different speed ("AMD EPYC" was a Zen 3 and a Zen 4 here): the record says
    which by the widest matmul instructions in the flags."""
    import machine

    cpuinfo = tmp_path / "cpuinfo"
    real = Path

    def fake(path, *a):
        return real(cpuinfo) if str(path) == "/proc/cpuinfo" else real(path, *a)

    monkeypatch.setattr(machine, "Path", fake)
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert machine.cpu_model() == "AMD EPYC [avx512_bf16]"
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma\n")
    assert machine.cpu_model() == "AMD EPYC [avx2]"
