"""Help that helps: every --help ends with examples that run as written, and every CLI error ends with the command
that fixes it."""

import re
import shlex
from pathlib import Path

import pytest

from turnrl.cli import EXAMPLES, _parser, main
from turnrl.completion import _subcommands
from turnrl.config import load_config

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = sorted(_subcommands(_parser()))


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_every_help_ends_with_examples(command, capsys):
    out = _help([command] if command else [], capsys)
    examples = out[out.index("\nexamples:\n") + 1 :]
    lines = [line for line in examples.splitlines()[1:] if line.startswith("  ")]
    assert len(lines) >= 2 and all("turnrl" in line for line in lines), examples
    if command:
        assert all(line.split("#")[0].split()[:2] in (["turnrl", command], ["source", "<(turnrl"]) for line in lines)


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_the_examples_parse_and_their_config_keys_exist(command):
    """Each example is a valid command line; a train / eval example's -c file and key=value overrides load."""
    parser = _parser()
    for line in (x for x in EXAMPLES[command].splitlines() if x.startswith("  ")):
        words = shlex.split(line.split("#")[0])
        if not words or words[0] != "turnrl" or "COMMAND" in words:
            continue
        args, extra = parser.parse_known_args(words[1:])
        if args.cmd in ("train", "eval"):
            load_config(ROOT / args.config if args.config else None, [*args.overrides, *extra])
        else:
            assert not [x for x in extra if x.startswith("-")], line


def _last_sentence_is_a_command(message: str) -> bool:
    """Whether the last sentence of ``message`` names a command: ``turnrl ...`` or ``pip install ...``."""
    last = re.split(r"[.?!] (?=[A-Z])", message.strip())[-1]
    return re.search(r"`?(turnrl|pip install) \S", last) is not None


@pytest.mark.probe("bad_input")
@pytest.mark.parametrize("argv, needle", [
    (["train", "--resume", "{tmp}/no-run"], "turnrl train --resume runs/NAME"),
    (["eval", "--checkpoint", "{tmp}/empty-run"], "turnrl train --resume {tmp}/empty-run"),
    (["eval", "--base-url", "http://localhost:8000/v1"], "turnrl eval --engine openai --base-url"),
    (["eval", "--engine", "openai"], "turnrl eval --engine openai --base-url"),
    (["play", "frozenlake-v0", "slippery"], "turnrl play frozenlake-v0 slippery=true"),
    (["envs", "--import", "mod_that_imports_a_missing_one"], "pip install missing_package_xyz"),
    (["train", "train.lrr=1e-5"], "`turnrl train --help-config`"),
])
def test_cli_errors_end_with_the_command_that_fixes_them(argv, needle, tmp_path, monkeypatch, capsys):
    (tmp_path / "empty-run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "empty-run" / "config.yaml").write_text("{}\n")
    (tmp_path / "mod_that_imports_a_missing_one.py").write_text("import missing_package_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (eval may first say which config it read)
    assert err.startswith("error: "), err
    assert needle.format(tmp=tmp_path) in err and _last_sentence_is_a_command(err), err


def test_an_unknown_option_points_to_the_commands_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--no-such-option"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith("the options are in `turnrl train --help`")
