"""The Python API (turnrl.train, turnrl.evaluate) is the CLI's code path: the same run, the same files."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import turnrl
from turnrl.api import resolve_config
from turnrl.cli import main
from turnrl.config import Config, ConfigError, load_config
from tests.test_docs import python_blocks

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.autocast_bf16=false", "rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=3",
        "eval.num_tasks=2", "log.progress=false", "log.tensorboard=false", "log.report=false",
        "algo.skip_zero_advantage=false", "train.steps=2", "log.checkpoint_every=0"]


def first_turn_bonus(trajectory, t):
    """The reward function both runs use (the API's ``reward=``, the CLI's ``algo.prm``): 0.25 for a turn 0."""
    return 0.25 if t == 0 else 0.0


def _rows(path: Path) -> list[dict]:
    """A JSONL log's rows without timings (``perf/*``), which differ between any two runs."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    """The same tiny run, once by `turnrl train` and once by `turnrl.train`; returns (cli run dir, api RunResult)."""
    root = tmp_path_factory.mktemp("api")
    common = [f"model.path={tiny_model_dir}", *TINY, f"log.run_dir={root / 'runs'}"]
    prm = f"algo.prm={first_turn_bonus.__module__}:first_turn_bonus"
    assert main(["train", *common, prm, "log.name=cli"]) == 0
    return root / "runs" / "cli", turnrl.train(None, *common, "log.name=api", reward=first_turn_bonus)


def test_the_api_run_equals_the_cli_run(runs):
    cli, api = runs
    assert api.run_dir.name == "api" and api.state == "finished" and api.ran
    for log in ("metrics.jsonl", "trajectories.jsonl", "task_keys.jsonl"):
        assert _rows(api.run_dir / log) == _rows(cli / log), log
    trajectories = _rows(api.run_dir / "trajectories.jsonl")  # equal above: the same ids (step, index, seed), tokens
    assert {r["step"] for r in trajectories} == {1, 2}
    assert all(r["turns"][0]["reward_components"]["prm"] == 0.25 for r in trajectories)  # the reward function ran
    assert load_config(api.run_dir / "config.yaml").algo.prm == load_config(cli / "config.yaml").algo.prm


def test_the_run_result_holds_the_last_step_and_evaluation(runs):
    _, api = runs
    rows = [json.loads(line) for line in (api.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert api.metrics == rows[-1] and api.metrics["step"] == 2
    assert api.evaluation.success_rate == rows[-1]["eval/success_rate"] and api.evaluation.distinct_tasks == 2
    assert api.evaluation.ci_low <= api.evaluation.success_rate <= api.evaluation.ci_high


def test_evaluate_returns_what_turnrl_eval_prints(runs, capsys):
    cli, _ = runs
    assert main(["eval", "--checkpoint", str(cli), "--json"]) == 0
    line, metrics = capsys.readouterr().out.strip().splitlines()
    result = turnrl.evaluate(checkpoint=cli)
    assert str(result) == line and line.startswith("frozenlake-v0: success")
    without_time = {k: v for k, v in json.loads(metrics).items() if k != "perf/eval_s"}
    assert {k: v for k, v in result.metrics.items() if k != "perf/eval_s"} == without_time


def test_resuming_a_finished_run_runs_nothing_and_says_how_to_extend_it(runs, capsys):
    _, api = runs
    before = (api.run_dir / "metrics.jsonl").read_text()
    again = turnrl.train(resume=api.run_dir)
    assert not again.ran and again.state == "finished" and again.metrics == api.metrics
    assert f"turnrl train --resume {api.run_dir} train.steps=4" in capsys.readouterr().out
    assert (api.run_dir / "metrics.jsonl").read_text() == before


def test_a_config_a_yaml_path_or_nothing_each_take_overrides(tmp_path):
    yaml_path = tmp_path / "c.yaml"
    yaml_path.write_text("rollout:\n  group_size: 4\n")
    given = Config()
    given.train.steps = 7
    assert resolve_config(None, ["train.lr=1e-5"]) == load_config(None, ["train.lr=1e-5"])
    assert resolve_config(yaml_path, ["train.lr=1e-5"]) == load_config(yaml_path, ["train.lr=1e-5"])
    cfg = resolve_config(given, ["train.lr=1e-5"])
    assert (cfg.train.steps, cfg.train.lr, given.train.lr) == (7, 1e-5, Config().train.lr)  # the given one is unchanged
    with pytest.raises(ConfigError, match="Did you mean 'train.lr'"):
        resolve_config(given, ["train.lrr=1e-5"])


@pytest.mark.probe("bad_input")
def test_bad_api_inputs_say_what_to_pass(tmp_path):
    with pytest.raises(ConfigError, match="top level of a module"):
        turnrl.train(None, "train.steps=1", reward=lambda trajectory, t: 1.0)
    (tmp_path / "config.yaml").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"not a Config: turnrl train --resume .* train.steps=N"):
        turnrl.train(Config(), resume=tmp_path)
    with pytest.raises(FileNotFoundError, match="turnrl train --resume runs/NAME"):
        turnrl.train(resume=tmp_path / "no-run")
    with pytest.raises(ConfigError, match="engine='openai'"):
        turnrl.evaluate(base_url="http://localhost:8000/v1")


def test_import_turnrl_is_cheap_and_names_load_on_first_use():
    code = ("import sys, time\nt = time.perf_counter()\nimport turnrl\nprint(time.perf_counter() - t)\n"
            "assert 'torch' not in sys.modules and 'pydantic' not in sys.modules, 'import turnrl loaded more'\n"
            "turnrl.train, turnrl.evaluate, turnrl.Config, turnrl.register_env, turnrl.register_estimator\n"
            "assert 'torch' not in sys.modules, 'the API names loaded torch'\n"
            "assert dir(turnrl) == turnrl.__all__\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert float(run.stdout) < 0.5
    with pytest.raises(AttributeError, match="its names: .*register_env"):
        turnrl.no_such_name  # noqa: B018


def test_the_root_names_are_the_registries_and_functions_they_name():
    from turnrl import api, credit, envs

    assert (turnrl.train, turnrl.evaluate) == (api.train, api.evaluate)
    assert turnrl.register_env is envs.register and turnrl.register_estimator is credit.register_estimator


DOC_BLOCKS: dict[str, str] = {}  # code -> where it first appears (README.md's block is docs/api.md's first)
for _name in ("README.md", "docs/api.md"):
    for _line, _code in python_blocks(ROOT / _name):
        DOC_BLOCKS.setdefault(_code, f"{_name}:{_line}")


def test_the_readme_and_docs_show_the_api():
    assert any("turnrl.train(" in code and "turnrl.evaluate(" in code for _, code in python_blocks(ROOT / "README.md"))
    assert any("register_env" in code and "register_estimator" in code and "reward=" in code for code in DOC_BLOCKS)


def test_the_readme_table_for_trl_and_verl_users_names_real_keys():
    """Each row of the README's table: the TRL and verl names are ones turnrl suggests the row's turnrl key for."""
    from turnrl.config import ALIASES, valid_keys

    text = (ROOT / "README.md").read_text()
    table = text[text.index("| TRL | verl | turnrl |"):].split("\n\n", 1)[0].splitlines()[2:]
    assert len(table) >= 10
    for row in table:
        trl, verl, ours = (cell.strip() for cell in row.strip("|").split("|"))
        keys = [k for k in ours.split("`")[1::2] if k in valid_keys()]
        assert keys, row
        for names in (trl, verl):
            for name in names.split("`")[1::2]:
                alias = ALIASES.get(name) or next(a for n, a in ALIASES.items() if n.endswith("." + name))
                assert set(alias.keys) & set(keys), (name, alias.keys, row)


@pytest.mark.parametrize("code", list(DOC_BLOCKS), ids=list(DOC_BLOCKS.values()))
def test_docs_example_runs_as_pasted(code, tmp_path):
    """Each ```python block of README.md and docs/api.md (identical blocks once), alone, in an empty directory: the
    examples train the real default model for one small step."""
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"{DOC_BLOCKS[code]} failed:\n{run.stderr[-3000:]}"
