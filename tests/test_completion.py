"""Shell completion: `turnrl completion bash` sourced in bash completes commands, options, config keys and values,
asking the CLI's parser and the config schema at every TAB (so it never goes stale)."""

import subprocess
import sys

import pytest

from turnrl.cli import _parser, main
from turnrl.completion import _subcommands, candidates, script
from turnrl.config import valid_keys

# (the words as bash splits them: it breaks words at '=' and ':', the completions bash gets for the last word)
CASES = [
    (["turnrl", "tr"], ["train"]),
    (["turnrl", "train", "train.l"], ["train.lr="]),
    (["turnrl", "train", "-c", "configs/x.yaml", "rollout.group"], ["rollout.group_size="]),
    (["turnrl", "eval", "algo.estimator", "=", "grpo"], ["grpo", "grpo_turn"]),
    (["turnrl", "train", "rollout.context", "="], ["=per_step", "=full", "=budgeted"]),
    (["turnrl", "train", "log.wandb", "=", "t"], ["true"]),
    (["turnrl", "train", "env.id", "=", "gym-ta"], ["gym-taxi-v0"]),
    (["turnrl", "train", "--res"], ["--resume"]),
    (["turnrl", "eval", "--engine", ""], ["hf", "vllm", "openai"]),
    (["turnrl", "play", "sokob"], ["sokoban-hier-v0", "sokoban-v0"]),  # play takes multi-agent envs too (hot seat)
    (["turnrl", "play", "sokoban-v0", "sokob"], []),  # play's env arguments are the env's own
    (["turnrl", "completion", ""], ["bash", "zsh"]),
    (["turnrl", "train", "--resume", ""], []),  # a path: bash falls back to file names (complete -o default)
]


@pytest.fixture(scope="module")
def turnrl_on_path(tmp_path_factory):
    """A directory holding a `turnrl` that runs this checkout's CLI with this interpreter."""
    bin_dir = tmp_path_factory.mktemp("bin")
    shim = bin_dir / "turnrl"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m turnrl.cli "$@"\n')
    shim.chmod(0o755)
    return bin_dir


def test_the_bash_script_completes_in_bash(turnrl_on_path, tmp_path, capsys):
    assert main(["completion", "bash"]) == 0
    (tmp_path / "turnrl.bash").write_text(capsys.readouterr().out)
    calls = "\n".join(
        "COMP_WORDS=(" + " ".join(f"'{w}'" for w in words) + f"); COMP_CWORD={len(words) - 1}; COMPREPLY=(); _turnrl; "
        "printf '%s\\n' \"${COMPREPLY[*]}\"" for words, _ in CASES)
    shell = f'export PATH="{turnrl_on_path}:$PATH"\nsource "{tmp_path / "turnrl.bash"}"\ncomplete -p turnrl\n{calls}\n'
    run = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "complete -o default -F _turnrl turnrl"
    for (words, want), got in zip(CASES, lines[1:], strict=True):
        assert sorted(got.split()) == sorted(want), words


def test_subcommands_are_the_parsers_own():
    parser = _parser()
    assert set(candidates(parser, ["turnrl", ""], 1)) == set(_subcommands(parser)) >= {"train", "eval", "completion"}


def test_config_keys_come_from_the_schema():
    parser = _parser()
    assert candidates(parser, ["turnrl", "train", ""], 2) == [f"{k}=" for k in valid_keys()]
    lora = [f"{k}=" for k in valid_keys() if k.startswith("lora.")]
    assert candidates(parser, ["turnrl", "eval", "lora."], 2) == lora and lora


def test_a_newly_registered_estimator_completes_without_a_new_script(monkeypatch):
    from turnrl.credit import base, get_estimator, register_estimator

    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    register_estimator("zz_mine")(get_estimator("grpo").__wrapped__)
    assert candidates(_parser(), ["turnrl", "train", "algo.estimator", "=", "zz"], 4) == ["zz_mine"]


def test_the_hidden_flag_prints_one_candidate_a_line(capsys):
    assert main(["--complete", "2", "turnrl", "train", "train.gra"]) == 0
    assert capsys.readouterr().out == "train.grad_clip=\n"


def test_the_zsh_script_asks_turnrl_with_zsh_word_numbering():
    zsh = script("zsh")
    assert zsh.startswith("#compdef turnrl\n")
    assert '"${words[1]}" --complete $((CURRENT - 1)) "${words[@]}"' in zsh  # zsh counts words from 1
    assert "compdef _turnrl turnrl" in zsh and "_files" in zsh
