"""``turnrl init env NAME``: the package it writes passes its own tests, and bad input is one clear line."""

import os
import subprocess
import sys

import pytest

from turnrl.cli import main
from turnrl.envs.scaffold import FILES, ScaffoldError, names, write_env_package


def test_init_env_writes_a_package_whose_own_tests_pass(tmp_path, capsys):
    assert main(["init", "env", "number-walk", "--dir", str(tmp_path)]) == 0
    root = tmp_path / "number-walk"
    assert str(root) in capsys.readouterr().out
    written = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert written == {"pyproject.toml", "README.md", "configs/number-walk.yaml", "src/number_walk/__init__.py",
                       "src/number_walk/env.py", "tests/test_env.py"}
    pyproject = (root / "pyproject.toml").read_text()
    assert '[project.entry-points."turnrl.envs"]\n"number-walk-v0" = "number_walk.env:NumberWalk"' in pyproject
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the package must find its own src/
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "23 passed" in out.stdout  # check_env, the oracle on 20 seeds, invalid text, the config


@pytest.mark.parametrize("name, dist, env_id, package, cls", [
    ("number-walk", "number-walk", "number-walk-v0", "number_walk", "NumberWalk"),
    ("grid_maze2", "grid_maze2", "grid_maze2-v0", "grid_maze2", "GridMaze2"),
    ("guess", "guess", "guess-v0", "guess", "Guess"),
])
def test_a_name_becomes_a_distribution_an_env_id_a_package_and_a_class(name, dist, env_id, package, cls):
    assert names(name) == {"dist": dist, "env_id": env_id, "package": package, "cls": cls}


@pytest.mark.parametrize("bad", ["NumberWalk", "number-walk-v0", "2walk", "number--walk", "walk-", "my env", ""])
def test_a_bad_name_is_refused_in_one_line_with_an_example(bad, tmp_path, capsys):
    with pytest.raises(ScaffoldError, match="turnrl init env number-walk"):
        names(bad)
    assert main(["init", "env", bad, "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: env name") and err.count("\n") == 1 and not any(tmp_path.iterdir())


def test_a_non_empty_directory_is_never_overwritten(tmp_path):
    (tmp_path / "guess").mkdir()
    (tmp_path / "guess" / "notes.txt").write_text("mine")
    with pytest.raises(ScaffoldError, match="already exists and is not empty"):
        write_env_package("guess", tmp_path)
    assert [p.name for p in (tmp_path / "guess").iterdir()] == ["notes.txt"]
    assert len(list(write_env_package("guess", tmp_path / "elsewhere").rglob("*.*"))) == len(FILES)
