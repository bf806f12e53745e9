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


@pytest.mark.probe("bad_input")
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


@pytest.mark.probe("bad_input")
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


@pytest.mark.probe("bad_input")
def test_bad_files_and_values_exit_2_writing_nothing(tmp_path, capsys):
    runs = tmp_path / "runs"
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 8)
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("train: {steps: 3\n")
    cases = [["-c", str(binary)], ["-c", str(tmp_path)], ["-c", str(bad_yaml)], ["algo.prm=no_such_module_here:score"],
             ["algo.prm=json:no_such_function"], ["train.lr=.inf"], ["rollout.temperature=.inf"], ["train.steps=0"]]
    for args in cases:
        assert main(["train", *args, f"log.run_dir={runs}"]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, (args, err)
        assert not runs.exists(), args  # no run directory was created


@pytest.mark.probe("fault")
def test_a_down_openenv_server_is_one_line_and_writes_nothing(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["train", "env.id=openenv-v0", "env.kwargs.url=http://127.0.0.1:9", f"log.run_dir={runs}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "cannot reach the OpenEnv server" in err
    assert "python -m turnrl.envs.adapters.openenv" in err and not runs.exists()


def test_help_config_for_one_key_with_the_resolved_values(tmp_path, capsys):
    assert main(["train", "--help-config", "train.lr"]) == 0
    out = capsys.readouterr().out
    assert "train.lr = 2e-05" in out and "rollout.group_size" not in out
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rollout:\n  group_size: 3\n")
    assert main(["train", "-c", str(cfg), "--help-config", "rollout", "rollout.temperature=0.7"]) == 0
    out = capsys.readouterr().out
    assert "rollout.group_size = 3  (default 8)" in out and "rollout.temperature = 0.7  (default 1.0)" in out
    assert "train.lr" not in out
    assert main(["train", "rollout.group_size=3", "--import", "json", "--help-config", "rollout", "rollout.top_k=5"]) == 0
    out = capsys.readouterr().out  # key=value on both sides of options
    assert "rollout.group_size = 3  (default 8)" in out and "rollout.top_k = 5  (default 0)" in out
    assert main(["train", "--help-config", "rollout.grup_size"]) == 2
    assert "Did you mean 'rollout.group_size'" in capsys.readouterr().err


@pytest.mark.probe("fault")
def test_eval_timeout_and_retries_reach_the_remote_engine(capsys):
    # port 9 (discard) refuses at once: the message reports the options it was given
    argv = ["eval", "--engine", "openai", "--base-url", "http://127.0.0.1:9/v1", "--api-model", "m",
            "--timeout", "0.5", "--max-retries", "0", "eval.num_tasks=1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "now 0.5s" in err and "now 0)" in err
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "--timeout" in capsys.readouterr().out


# --------------------------------------------------------------------------- user code (issue 25.4)

GUESS_ENV = '''
from turnrl.envs import Env, register


class Guess(Env):
    instructions = "Guess the number from 1 to 3."

    def reset(self, *, seed=None, options=None):
        self.secret = 1 + (seed or 0) % 3
        return "guess a number", {}

    def step(self, action_text):
        ok = action_text.strip() == str(self.secret)
        info = {"actions": [action_text.strip()], "valid": True, "success": ok, "reward_components": {"outcome": float(ok)}}
        return ("right" if ok else "wrong"), float(ok), ok, False, info


register("guess-v0", Guess, description="a user's env from --import")
'''

USER_ESTIMATOR = '''
from turnrl.credit import get_estimator, register_estimator


@register_estimator("user_grpo")
def user_grpo(groups, params):
    return get_estimator("grpo")(groups, params)
'''


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A working directory holding the user's modules; registries, sys.path and sys.modules restored afterwards."""
    import sys

    from turnrl.credit import base as credit_base
    from turnrl.envs import registry

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(credit_base, "_REGISTRY", dict(credit_base._REGISTRY))
    (tmp_path / "guessmod.py").write_text(GUESS_ENV)
    (tmp_path / "userest.py").write_text(USER_ESTIMATOR)
    return tmp_path


def test_import_option_loads_user_envs_from_the_current_directory(user_dir, monkeypatch, capsys):
    answers = iter(["3", "q"])
    monkeypatch.setattr("builtins.input", lambda _: next(answers))
    assert main(["play", "guess-v0", "--import", "guessmod", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "Guess the number" in out and "right" in out
    assert main(["envs", "--import", "guessmod"]) == 0
    assert "guess-v0" in capsys.readouterr().out


def test_import_option_loads_user_estimators_before_the_config(user_dir, capsys):
    argv = ["train", "--import", "userest", "--import", "guessmod", "algo.estimator=user_grpo", "env.id=guess-v0",
            "--help-config", "algo.estimator"]
    assert main(argv) == 0
    assert "algo.estimator = 'user_grpo'" in capsys.readouterr().out


@pytest.mark.parametrize("name, needle", [("no_such_user_module", "No module named 'no_such_user_module'"),
                                          ("guessmod.py", "--import guessmod")])
@pytest.mark.probe("bad_input")
def test_import_option_errors_say_what_to_pass(user_dir, capsys, name, needle):
    assert main(["envs", "--import", name]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


@pytest.mark.probe("fault")
def test_a_run_a_signal_stopped_exits_as_the_shell_reports_that_signal(tmp_path):
    """`turnrl train` stopped by SIGTERM / Ctrl-C (checkpoint and report written) exits 143 / 130, not 0."""
    from turnrl.cli import _exit_code
    from turnrl.monitor.files import write_status

    for state, message, code in [("stopped", "SIGTERM before step 3; resume with ...", 143),
                                 ("stopped", "SIGINT before step 3; resume with ...", 130),
                                 ("stopped", "train.max_minutes at step 4; resume with ...", 0),
                                 ("finished", "4 steps", 0)]:
        write_status(tmp_path, state, 3, 4, message)
        assert _exit_code(tmp_path) == code, (state, message)
