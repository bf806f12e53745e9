"""`turnrl eval --suite`: suite files, held-out tasks disjoint from what a checkpoint trained on, and the matrix."""

import json
from pathlib import Path

import pytest
import yaml

from tests.test_curriculum import leveled  # noqa: F401 - a fixture: leveled-v0 registered for one test
from turnrl.cli import main
from turnrl.config import ConfigError
from turnrl.envs import make
from turnrl.evalsuite import held_out_tasks, load_suite, trained_keys

SUITES = sorted((Path(__file__).resolve().parents[1] / "configs" / "suites").glob("*.yaml"))


@pytest.mark.parametrize("path", SUITES, ids=[p.name for p in SUITES])
def test_shipped_suites_load_and_every_entry_builds(path):
    for entry in load_suite(path):
        env = make(entry.env.id, **entry.env.kwargs)
        env.reset(seed=0)
        env.close()


@pytest.mark.parametrize("text, message", [
    ("name: x", "non-empty YAML list"),
    ("- {name: a, num_tasks: 2}", r"entry 0: env: Field required"),
    ("- {name: a, env: {id: frozenlake-v0, kwarg: {}}}", r"entry 0: env.kwarg: Extra inputs"),
    ("- {name: a, env: {id: frozenlake-v0}}\n- {name: a, env: {id: sokoban-v0}}", r"names \['a'\] repeat"),
])
def test_a_bad_suite_is_a_clear_error(tmp_path, text, message):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_suite(path)


def test_held_out_tasks_are_distinct_and_skip_the_excluded_keys():
    """3x3 FrozenLake has few layouts: consecutive seeds repeat them."""
    envs = lambda: make("frozenlake-v0", size=3)  # noqa: E731
    first = held_out_tasks(envs, 1_000_000, 6, set())
    assert len({t.key for t in first}) == 6
    exclude = {first[0].key, first[2].key}
    again = held_out_tasks(envs, 1_000_000, 6, exclude)
    assert len({t.key for t in again}) == 6 and not exclude & {t.key for t in again}


def _run_dir(root: Path, name: str, train_keys: list[str], model_path: str, demo_keys: tuple[str, ...] = ()) -> Path:
    run = root / name
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {"path": model_path}}))
    rows = [{"step": 0, "split": "eval", "tasks": [{"seed": 9, "key": "held"}]},
            {"step": 1, "split": "train", "tasks": [{"seed": i, "key": k} for i, k in enumerate(train_keys)]}]
    (run / "task_keys.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "demos.jsonl").write_text("".join(json.dumps({"task_key": k}) + "\n" for k in demo_keys))
    return run


def test_trained_keys_cover_rl_tasks_sft_demonstrations_and_the_run_started_from(tmp_path):
    sft = _run_dir(tmp_path, "sft", [], "default", demo_keys=("demo-a",))
    rl = _run_dir(tmp_path, "rl", ["a", "b"], str(sft / "checkpoints" / "step_000001" / "model"))
    assert trained_keys(rl / "checkpoints" / "step_000001") == {"a", "b", "demo-a"}
    assert trained_keys(tmp_path) is None  # not a run: nothing known


def test_the_matrix_of_a_checkpoint_and_the_base_model(tmp_path, tiny_model_dir, capsys, leveled):
    """leveled-v0 is solved at level 0 and never at level 1, five tasks per level: the cells are known exactly, and
    the two level-0 tasks the run trained on are left out of the suite's."""
    common = [f"model.path={tiny_model_dir}", "model.autocast_bf16=false", "env.id=leveled-v0", "env.progress_reward=0",
              "rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=2", "eval.num_tasks=1",
              "eval.at_start=false", "log.progress=false", "log.tensorboard=false", "log.report=false",
              f"log.run_dir={tmp_path / 'runs'}", "log.name=r"]
    assert main(["train", "train.steps=1", *common]) == 0
    run = tmp_path / "runs" / "r"
    trained = {t["key"] for line in (run / "task_keys.jsonl").read_text().splitlines()
               for t in json.loads(line)["tasks"] if json.loads(line)["split"] == "train"}
    assert trained == {"level 0 task 1", "level 0 task 2"}  # seed 0's task is the held-out one
    suite = tmp_path / "levels.yaml"
    suite.write_text(yaml.safe_dump([{"name": "easy", "env": {"id": "leveled-v0", "kwargs": {"level": 0}}, "num_tasks": 5},
                                     {"name": "hard", "env": {"id": "leveled-v0", "kwargs": {"level": 1}}, "num_tasks": 2}]))
    capsys.readouterr()
    assert main(["eval", "--suite", str(suite), "--checkpoint", str(run), "--base", "--pass-k", "2"]) == 0
    assert "| model | easy (leveled-v0, level=0) | hard (leveled-v0, level=1) |" in capsys.readouterr().out
    matrix = json.loads((run / "suite-levels.json").read_text())
    assert [r["model"] for r in matrix["rows"]] == [f"base ({tiny_model_dir})", str(run)]
    assert matrix["excluded_keys"] == 2 and matrix["pass_k"] == 2
    for row in matrix["rows"]:
        easy, hard = row["cells"]
        assert (easy["success"], easy["pass_at_k"], easy["distinct_tasks"]) == (1.0, 1.0, 3)  # 5 tasks, 2 trained
        assert (hard["success"], hard["pass_at_k"], hard["distinct_tasks"]) == (0.0, 0.0, 2)
        assert 0.0 < hard["ci_high"] < 1.0 and easy["ci_low"] > 0.0 and easy["valid_action_rate"] == 1.0
    assert (run / "suite-levels.md").read_text().count("| 1.000 [") == 2


def test_matrix_options_without_a_suite_are_refused(capsys):
    assert main(["eval", "--pass-k", "4"]) == 2
    assert "add --suite" in capsys.readouterr().err
