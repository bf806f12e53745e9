"""turnrl: reinforcement learning for LLM agents over multi-turn environments.

    import turnrl

    run = turnrl.train(None, "train.steps=10")       # a Config, a YAML path or None (the defaults), then overrides
    print(turnrl.evaluate(checkpoint=run.run_dir))   # held-out success with its 95% interval

The names below are what a user's code needs (``docs/api.md``); each is imported on first use (PEP 562), so
``import turnrl`` loads nothing else and a run loads torch only when it is built.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (it alone would double this module's import time)

#: Public name -> (module, attribute).
_EXPORTS = {
    "train": ("turnrl.api", "train"),
    "evaluate": ("turnrl.api", "evaluate"),
    "sft": ("turnrl.api", "sft"),
    "RunResult": ("turnrl.api", "RunResult"),
    "EvalResult": ("turnrl.api", "EvalResult"),
    "Config": ("turnrl.config", "Config"),
    "load_config": ("turnrl.config", "load_config"),
    "Env": ("turnrl.envs", "Env"),
    "register_env": ("turnrl.envs", "register"),
    "check_env": ("turnrl.envs", "check_env"),
    "register_estimator": ("turnrl.credit", "register_estimator"),
    "get_estimator": ("turnrl.credit", "get_estimator"),
    "Trajectory": ("turnrl.types", "Trajectory"),
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from typing import Any

    from turnrl.api import EvalResult, RunResult, evaluate, sft, train
    from turnrl.config import Config, load_config
    from turnrl.credit import get_estimator, register_estimator
    from turnrl.envs import Env, check_env
    from turnrl.envs import register as register_env
    from turnrl.types import Trajectory


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'turnrl' has no attribute {name!r}; its names: {', '.join(__all__)}")
    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # the next lookup skips this function
    return value


def __dir__() -> list[str]:
    return __all__
