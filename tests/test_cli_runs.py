"""`turnrl eval --checkpoint RUN` and `turnrl train --resume RUN` keep the run's settings (issue 25.2, 25.3)."""

import json
import shutil

import pytest
import yaml

from turnrl.cli import main
from turnrl.config import load_config

TINY = ["model.autocast_bf16=false", "rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=2",
        "eval.num_tasks=2", "log.progress=false", "log.tensorboard=false", "log.report=false", "algo.skip_zero_advantage=false"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """A finished one-step run of a tiny model (trained once per module; tests work on copies)."""
    root = tmp_path_factory.mktemp("trained")
    assert main(["train", "train.steps=1", f"model.path={tiny_model_dir}", *TINY, f"log.run_dir={root / 'runs'}", "log.name=r"]) == 0
    return root / "runs" / "r"


@pytest.fixture
def run(trained, tmp_path):
    return shutil.copytree(trained, tmp_path / "r")


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_eval_uses_the_runs_config(tmp_path, tokenizer, tiny_model, capsys):
    from turnrl.checkpoint import save_checkpoint

    run = tmp_path / "qa-run"
    save_checkpoint(run, 1, tiny_model, tokenizer, {})  # evaluation reads only the weights
    cfg = load_config(None, ["env.id=searchqa-v0", "env.max_turns=2", "rollout.context=full", "model.path=/gone/base-model",
                             *TINY, "eval.num_tasks=3"])
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))

    for target, extra, tasks in [(run, [], 3), (run / "checkpoints" / "step_000001", [], 3), (run, ["eval.num_tasks=1"], 1)]:
        assert main(["eval", "--checkpoint", str(target), "--json", *extra]) == 0, target
        out = capsys.readouterr().out
        assert out.startswith("searchqa-v0: success"), out
        assert json.loads(out.strip().splitlines()[-1])["eval/num_tasks"] == tasks
    assert main(["eval", "--checkpoint", str(run), "--help-config", "env.id"]) == 0
    assert "env.id = 'searchqa-v0'  (default 'frozenlake-v0')" in capsys.readouterr().out


@pytest.mark.probe("bad_input")
def test_resume_refuses_changes_that_the_checkpoint_cannot_take(run, tmp_path, capsys):
    before = (run / "config.yaml").read_text()
    other = tmp_path / "other.yaml"
    other.write_text("algo:\n  estimator: rloo\n")
    for args, key in [(["rollout.group_size=4"], "rollout.group_size"), (["-c", str(other), "train.steps=3"], "algo.estimator")]:
        assert main(["train", "--resume", str(run), *args]) == 2
        err = capsys.readouterr().err
        assert key in err and "cannot change on resume" in err and f"model.path={run}/checkpoints/step_000001/model" in err
    assert (run / "config.yaml").read_text() == before and not (run / "config_changes.jsonl").exists()
    assert (run / "checkpoints" / "latest").read_text() == "step_000001"


def test_resume_applies_and_records_changes_then_says_when_finished(run, capsys):
    assert main(["train", "--resume", str(run), "train.steps=2", "eval.num_tasks=1"]) == 0
    assert (run / "checkpoints" / "latest").read_text() == "step_000002"
    cfg = load_config(run / "config.yaml")
    assert cfg.train.steps == 2 and cfg.eval.num_tasks == 1
    assert _rows(run / "config_changes.jsonl") == [{"step": 1, "key": "train.steps", "old": 1, "new": 2},
                                                   {"step": 1, "key": "eval.num_tasks", "old": 2, "new": 1}]
    assert [r["eval/num_tasks"] for r in _rows(run / "metrics.jsonl") if "eval/num_tasks" in r][-1] == 1.0
    capsys.readouterr()

    metrics = (run / "metrics.jsonl").read_text()
    assert main(["train", "--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert "already finished" in out and out.rstrip().endswith(f"turnrl train --resume {run} train.steps=4")
    assert (run / "metrics.jsonl").read_text() == metrics and (run / "checkpoints" / "latest").read_text() == "step_000002"


def test_resume_new_lr_reaches_the_optimizer(run):
    assert main(["train", "--resume", str(run), "train.steps=2", "train.lr=1e-5"]) == 0
    step2 = [r for r in _rows(run / "metrics.jsonl") if r.get("step") == 2 and "train/lr" in r]
    assert step2 and step2[-1]["train/lr"] == pytest.approx(1e-5)
    assert load_config(run / "config.yaml").train.lr == 1e-5
