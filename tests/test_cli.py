"""Every CLI entry point runs, with a tiny local model directory standing in for the default."""

import json

import pytest

from turnrl.cli import main


@pytest.fixture
def tiny_dir(tmp_path, tokenizer, tiny_model):
    d = tmp_path / "tiny"
    tiny_model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


def test_envs_lists_builtins(capsys):
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    assert "frozenlake-v0" in out and "sokoban-v0" in out


def test_config_errors_exit_2_with_the_fix(capsys):
    assert main(["train", "train.lrr=1e-5"]) == 2
    assert "Did you mean 'train.lr'" in capsys.readouterr().err


def test_help_config(capsys):
    assert main(["train", "--help-config"]) == 0
    assert "rollout.group_size" in capsys.readouterr().out


def test_train_then_resume_then_eval(tmp_path, tiny_dir, capsys):
    common = [f"model.path={tiny_dir}", "model.autocast_bf16=false", "rollout.tasks_per_step=2", "rollout.group_size=2",
              "rollout.max_new_tokens=2", "eval.num_tasks=2", "log.progress=false", "log.tensorboard=false",
              f"log.run_dir={tmp_path / 'runs'}", "log.name=r", "algo.skip_zero_advantage=false"]
    assert main(["train", "train.steps=1", *common]) == 0
    run = tmp_path / "runs" / "r"
    assert (run / "checkpoints" / "latest").read_text() == "step_000001"
    assert main(["train", "--resume", str(run), "train.steps=2"]) == 0
    assert (run / "checkpoints" / "latest").read_text() == "step_000002"
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--json", *common]) == 0
    out = capsys.readouterr().out
    assert "95% CI" in out
    m = json.loads(out.strip().splitlines()[-1])
    assert m["eval/num_tasks"] == 2.0 and 0.0 <= m["eval/success_ci_low"] <= m["eval/success_rate"] <= m["eval/success_ci_high"]


def test_bad_inputs_are_clear_errors_not_tracebacks(tmp_path, capsys):
    assert main(["eval", f"model.path={tmp_path / 'nope'}"]) == 2
    assert "never downloads" in capsys.readouterr().err
    assert main(["train", "env.kwargs.slipery=true", f"log.run_dir={tmp_path}"]) == 2
    assert "Did you mean 'slippery'" in capsys.readouterr().err
    assert main(["train", "env.id=frozenlak-v0", f"log.run_dir={tmp_path}"]) == 2
    assert "Did you mean 'frozenlake-v0'" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path / "no-run")]) != 0
    assert main(["play", "frozenlak-v0"]) == 2
    assert main(["play", "frozenlake-v0", "slipery=true"]) == 2
    assert "Did you mean 'slippery'" in capsys.readouterr().err
    assert main(["train", "-c", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_play_reads_stdin(monkeypatch, capsys):
    answers = iter(["Down", "q"])
    monkeypatch.setattr("builtins.input", lambda _: next(answers))
    assert main(["play", "frozenlake-v0", "map_name=4x4", "--seed", "0"]) == 0
    assert "reward" in capsys.readouterr().out


def test_watch_renders_a_run(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 0, "eval/success_rate": 0.0},
            {"step": 1, "rollout/success_rate": 0.25, "rollout/reward": 0.5, "rollout/valid_action_rate": 0.9,
             "train/entropy": 1.2, "train/grad_norm": 0.7, "perf/rollout_s": 3.0, "perf/train_s": 4.0, "eval/success_rate": 0.5}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (run / "alerts.jsonl").write_text(json.dumps({"step": 1, "name": "grad_spike", "message": "big", "evidence": {}}) + "\n")
    assert main(["watch", str(run), "--once"]) == 0
    out = capsys.readouterr().out
    assert "0.25" in out and "7.0" in out and "step 1: 0.50" in out and "[grad_spike] big" in out
    assert main(["watch", str(tmp_path / "nothing"), "--once"]) == 2
