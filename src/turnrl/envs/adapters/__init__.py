"""Adapters between turnrl's Env contract and the ecosystem's environment standards.

One module per standard; each imports its package lazily, so ``turnrl envs`` lists the adapter ids
without the packages and ``make`` names the extra to install when one is missing
(``pip install 'turnrl[envs]'``):

- :mod:`~turnrl.envs.adapters.openenv`: serve any turnrl env as an OpenEnv server (WebSocket sessions),
  and drive any OpenEnv server as a turnrl env (``openenv-v0``), through the client of
  :mod:`~turnrl.envs.adapters.openenv_client` (typed faults, validated replies);
- :mod:`~turnrl.envs.adapters.textarena`: TextArena's single-player games (``textarena-v0``);
- :mod:`~turnrl.envs.adapters.reasoning_gym`: any reasoning-gym dataset, one or k attempts
  (``reasoning-gym-v0``);
- :mod:`~turnrl.envs.adapters.gymnasium`: Gymnasium's toy-text envs rendered as text
  (``gym-frozenlake-v0``, ``gym-taxi-v0``, ``gym-cliffwalking-v0``, ``gym-blackjack-v0``).
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ImportError):
    """An adapter's package is not installed; the message names the pip command that installs it."""


def require(module: str, package: str, extra: str = "envs") -> ModuleType:
    """Import ``module`` (from the PyPI ``package``), or raise :class:`MissingExtraError` saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name is not None and e.name.split(".")[0] != module.split(".")[0]:
            raise  # the package is there but one of its own imports failed: show the real error
        raise MissingExtraError(
            f"this env needs the '{package}' package, which is not installed. "
            f"Install it with: pip install 'turnrl[{extra}]' (or pip install {package})"
        ) from e


__all__ = ["MissingExtraError", "require"]
