"""``turnrl init env NAME``: write an env package that installs with ``pip`` and passes its own tests out of the box.

The package (``NAME/``) holds ``pyproject.toml`` declaring the env in the ``turnrl.envs`` entry-point group (so
``pip install ./NAME`` makes ``turnrl envs`` list ``NAME-v0`` and ``env.id=NAME-v0`` train on it), the env class in
``src/PACKAGE/env.py`` (a small seeded task with ``reset``, ``step``, ``anchor``, ``task_key``, ``solve``,
``examples`` and ``render``, to be replaced by the author's own), ``tests/test_env.py`` (``check_env``, the oracle on
many seeds, the config), ``configs/NAME.yaml`` (a training recipe) and ``README.md``. The templates are the string
constants below, filled with :class:`string.Template` (``$name`` placeholders, so Python braces stay literal).
"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

_NAME = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$")
_VERSIONED = re.compile(r"-v\d+$")

PYPROJECT = '''\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "$dist: a turnrl environment (walk to the target on a number line)"
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["turnrl"]

# turnrl finds the env here once the package is installed: `turnrl envs` lists it, `env.id=$env_id` makes it.
[project.entry-points."turnrl.envs"]
"$env_id" = "$package.env:$cls"

[tool.setuptools.packages.find]
where = ["src"]

[tool.pytest.ini_options]
pythonpath = ["src"]
testpaths = ["tests"]
'''

INIT = '''\
"""$dist: a turnrl environment, registered as `$env_id` through the `turnrl.envs` entry point (pyproject.toml)."""

from $package.env import $cls

__all__ = ["$cls"]
'''

ENV = '''\
"""$cls: walk a marker along a number line to the target.

Replace the task with your own; keep the contract (turnrl/envs/base.py) and run the tests (`pytest`), which run
`check_env` on it. Each seed draws a start and a target in 0..size-1; the model answers `left` or `right` (one move
a turn) and is paid 1 when the marker reaches the target.
"""

from __future__ import annotations

import random
from typing import Any

from turnrl.envs import Env
from turnrl.envs.parsing import parse_actions

SIZE = 10
ACTIONS = ("left", "right")


class $cls(Env):
    """The number-line walk. Terminated when the marker reaches the target; the turn limit truncates."""

    instructions = (
        "You move a marker on a number line to the target. Answer with one move, left or right, "
        "as <answer>left</answer> or <answer>right</answer>."
    )

    def __init__(self, size: int = SIZE) -> None:
        if size < 2:
            raise ValueError(f"size={size}: the line needs at least 2 positions")
        self.size = size
        self.rng = random.Random()
        self.start: int | None = None  # None until the first reset draws a task
        self.position = self.target = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """A new task from `seed`: a start and a different target, both drawn from the env's own seeded RNG."""
        if seed is not None:
            self.rng = random.Random(seed)
        self.start, self.target = self.rng.sample(range(self.size), 2)
        self.position = self.start
        return self.render(), {}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the first move in the text; text without one is an invalid turn that changes nothing."""
        actions = parse_actions(action_text, ACTIONS)
        if not actions:
            info = {"actions": [], "valid": False, "success": False, "reward_components": {"outcome": 0.0}}
            feedback = "Invalid: answer <answer>left</answer> or <answer>right</answer>.\\n" + self.render()
            return feedback, 0.0, False, False, info
        move = -1 if actions[0] == "left" else 1
        self.position = min(self.size - 1, max(0, self.position + move))
        done = self.position == self.target
        info = {"actions": actions, "valid": True, "success": done, "reward_components": {"outcome": float(done)}}
        return self.render(), float(done), done, False, info

    def anchor(self) -> str:
        """The state without history: where the marker is, and where it must go."""
        return f"{self.position}->{self.target}"

    def task_key(self) -> str:
        """What makes two tasks the same: the line, the start and the target (held-out tasks are disjoint by it)."""
        if self.start is None:
            raise RuntimeError("task_key() before reset(): the task is drawn by reset")
        return f"size={self.size} start={self.start} target={self.target}"

    def solve(self) -> list[str] | None:
        """A shortest plan from the current state."""
        distance = self.target - self.position
        return ["right"] * distance if distance > 0 else ["left"] * -distance

    def examples(self) -> list[tuple[str, str]]:
        """One fixed exchange shown to the model as a few-shot example."""
        return [(f"marker at 4, target at 6 (positions 0..{self.size - 1})", "<answer>right</answer>")]

    def render(self) -> str:
        return f"marker at {self.position}, target at {self.target} (positions 0..{self.size - 1})"
'''

TESTS = '''\
"""$dist's own tests: `pytest` here. They run without installing the package (pytest puts src/ on the path)."""

from pathlib import Path

import pytest

from turnrl.config import load_config
from turnrl.envs import check_env, make

ENTRY_POINT = "$package.env:$cls"  # what pyproject.toml declares as $env_id
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "$dist.yaml"


def test_the_env_keeps_the_turnrl_contract():
    check_env(ENTRY_POINT, seeds=(0, 1, 2), random_tasks=True)


@pytest.mark.parametrize("seed", range(20))
def test_the_oracle_solves_every_task_within_the_turn_limit(seed):
    env = make(ENTRY_POINT, max_turns=load_config(CONFIG).env.max_turns)
    env.reset(seed=seed)
    for action in env.unwrapped.solve():
        _, _, terminated, truncated, info = env.step(f"<answer>{action}</answer>")
    assert info["success"] and terminated and not truncated


def test_text_without_a_move_is_an_invalid_turn_that_changes_nothing():
    env = make(ENTRY_POINT)
    env.reset(seed=0)
    before = env.unwrapped.anchor()
    _, reward, terminated, _, info = env.step("I am not sure")
    assert not info["valid"] and reward == 0.0 and not terminated and env.unwrapped.anchor() == before


def test_the_config_trains_this_env():
    assert load_config(CONFIG).env.id == "$env_id"
'''

CONFIG = '''\
# A training recipe for $env_id: `turnrl train -c configs/$dist.yaml` once the package is installed
# (`pip install -e .`). Every key: `turnrl train --help-config`.
model:
  path: default
env:
  id: $env_id
  max_turns: 12
rollout:
  tasks_per_step: 4
  group_size: 8
  context: per_step
  few_shot: true
  max_new_tokens: 8
algo:
  estimator: grpo_turn
  gamma: 0.5
train:
  steps: 40
  lr: 2.0e-5
eval:
  every: 10
  num_tasks: 32
'''

README = '''\
# $dist

A turnrl environment: `$env_id`, a marker walked along a number line to a
target (`src/$package/env.py`). Replace the task with your own and keep the tests passing.

```bash
pip install -e .              # registers $env_id through the turnrl.envs entry point (pyproject.toml)
pytest                        # check_env, the oracle on 20 tasks, the config
turnrl envs                   # lists $env_id
turnrl play $env_id           # play it yourself
turnrl train -c configs/$dist.yaml
```

From Python, once installed: `turnrl.envs.make("$env_id")`. The env contract (`reset`, `step`, `anchor`,
`task_key`, `solve`) and what `check_env` checks are in turnrl's docs/envs.md.
'''

FILES = {
    "pyproject.toml": PYPROJECT,
    "README.md": README,
    "configs/$dist.yaml": CONFIG,
    "src/$package/__init__.py": INIT,
    "src/$package/env.py": ENV,
    "tests/test_env.py": TESTS,
}


class ScaffoldError(ValueError):
    """``turnrl init env`` cannot write the package: a bad name or a directory in the way; the message says the fix."""


def names(name: str) -> dict[str, str]:
    """What ``name`` (``my-env``) becomes: the distribution ``my-env``, env id ``my-env-v0``, package ``my_env``,
    class ``MyEnv``. Raises :class:`ScaffoldError` for a name that cannot be all of these."""
    if not _NAME.match(name) or _VERSIONED.search(name):
        raise ScaffoldError(
            f"env name {name!r} must be lower case letters and digits, words joined by '-' or '_', starting with a letter "
            "and without a version (the id gets -v0), e.g. turnrl init env number-walk")
    words = re.split(r"[-_]", name)
    return {"dist": name, "env_id": f"{name}-v0", "package": "_".join(words),
            "cls": "".join(w.capitalize() for w in words)}


def write_env_package(name: str, parent: Path | str = ".") -> Path:
    """Write the package of env ``name`` into ``parent/name`` and return that directory.

    Raises :class:`ScaffoldError` for a bad name or when ``parent/name`` exists and is not empty (nothing is written).
    """
    fill = names(name)
    root = Path(parent) / name
    if root.exists() and any(root.iterdir()):
        raise ScaffoldError(f"{root} already exists and is not empty: choose another name or directory "
                            f"(turnrl init env {name} --dir DIR), or delete it")
    for path, template in FILES.items():
        target = root / Template(path).substitute(fill)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(Template(template).substitute(fill))
    return root
