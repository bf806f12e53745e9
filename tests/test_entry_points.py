"""Envs from installed distributions: the ``turnrl.envs`` entry-point group, read through importlib.metadata.

A package written by ``turnrl init env`` is installed for real (``pip install -t SITE``); broken distributions are
``*.dist-info`` directories on the path, which importlib.metadata reads exactly as it reads installed ones.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from turnrl.envs import EnvLoadError, UnknownEnvError, make, registered
from turnrl.envs import registry
from turnrl.envs.scaffold import write_env_package

BROKEN = {  # distribution name -> entry_points.txt lines of the turnrl.envs group
    "broken-env": ["missing-v0 = broken_env_gone.env:Missing", "Not An Id = broken_env_gone.env:Missing",
                   "frozenlake-v0 = broken_env_gone.env:Clash"],
    "raising-env": ["raising-v0 = raising_env:Raising"],
}


def _dist_info(site: Path, name: str, entry_points: list[str]) -> None:
    info = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\nSummary: the {name} package\n")
    (info / "entry_points.txt").write_text("[turnrl.envs]\n" + "\n".join(entry_points) + "\n")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A site directory holding the scaffold's package, installed by pip, and two broken distributions."""
    root = tmp_path_factory.mktemp("pkgs")
    package = write_env_package("number-walk", root / "src")
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-t", str(site), str(package)], check=True, capture_output=True)
    for name, lines in BROKEN.items():
        _dist_info(site, name, lines)
    (site / "raising_env.py").write_text("raise RuntimeError('boom at import')\n")
    return site


@pytest.fixture
def on_path(site, monkeypatch):
    """``site`` importable in this process, and a registry that forgets what it discovers there afterwards."""
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_PROBLEMS", None)
    return site


def _turnrl(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "turnrl.cli", *args], env=env, capture_output=True, text=True, timeout=120)


def test_turnrl_envs_lists_an_installed_package_and_warns_about_broken_ones(site):
    out = _turnrl(site, "envs")
    assert out.returncode == 0, out.stderr
    listed = {line.split()[0]: line for line in out.stdout.splitlines()}
    assert "installed package number-walk 0.1.0" in listed["number-walk-v0"]
    assert {"frozenlake-v0", "missing-v0", "raising-v0"} <= set(listed)  # broken packages do not hide the others
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2 and all("'broken-env' 0.1.0" in w and "Fix:" in w for w in warnings)
    assert any("'Not An Id'" in w for w in warnings) and any("frozenlake-v0" in w and "already registered" in w for w in warnings)


def test_make_builds_the_installed_env_by_its_id(site):
    code = ("from turnrl.envs import make; env = make('number-walk-v0'); obs, _ = env.reset(seed=3); "
            "print(type(env.unwrapped).__module__, type(env.unwrapped).__name__, env.unwrapped.task_key(), sep='|')")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    module, cls, key = out.stdout.strip().split("|")
    assert (module, cls) == ("number_walk.env", "NumberWalk") and key.startswith("size=10 start=")


def test_discovery_registers_lazily_and_reports_each_bad_entry_point_once(on_path):
    problems = registry.discover()
    assert len(problems) == 2 and all("\n" not in p and "pip uninstall broken-env" in p for p in problems)
    assert "raising-v0" in registered() and "raising_env" not in sys.modules  # nothing imported before make
    assert registry.discover() == problems  # a second scan registers nothing twice
    assert make("frozenlake-v0").reset(seed=0)[0]  # the built-in that a package tried to take is untouched


@pytest.mark.parametrize("env_id, reason", [
    ("missing-v0", "ModuleNotFoundError: No module named 'broken_env_gone'"),
    ("raising-v0", "RuntimeError: boom at import"),
])
def test_a_broken_installed_env_is_one_line_naming_its_distribution_and_the_fix(on_path, env_id, reason):
    dist = "broken-env" if env_id == "missing-v0" else "raising-env"
    with pytest.raises(EnvLoadError) as e:
        make(env_id)
    message = str(e.value)
    assert "\n" not in message and f"'{dist}' 0.1.0" in message and reason in message
    assert f"pip install --force-reinstall {dist}" in message
    assert make("number-walk-v0").reset(seed=1)[0]  # the other installed env still loads


def test_an_unknown_id_also_names_the_entry_points_that_were_skipped(on_path):
    with pytest.raises(UnknownEnvError, match=r"Not registered: the installed distribution 'broken-env' 0\.1\.0"):
        make("nothing-here-v0")
