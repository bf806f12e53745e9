"""Register environments by versioned string id with a lazy ``"module:Class"`` entry point.

    register("frozenlake-v0", "turnrl.envs.frozenlake:FrozenLake", description="...", max_turns=8)
    env = make("frozenlake-v0", slippery=True, max_turns=12)

``make`` builds the env from its entry point and wraps it with the standard wrappers, configured by the
keyword arguments that belong to them (the rest go to the env's constructor):

- ``max_turns`` -> :class:`TurnLimit` (default: the registration's, else 16);
- ``invalid_penalty`` -> :class:`InvalidActionPenalty` (default 0: no penalty);
- ``progress_reward`` -> :class:`OracleProgress` (default 0: off);
- :class:`EpisodeStatistics`, always.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from turnrl.envs.base import Env
from turnrl.envs.wrappers import EpisodeStatistics, InvalidActionPenalty, OracleProgress, TurnLimit

_ID = re.compile(r"^[a-z0-9][a-z0-9_.]*-v\d+$")
WRAPPER_KWARGS = ("max_turns", "invalid_penalty", "progress_reward")


class UnknownEnvError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


@dataclass
class EnvSpec:
    env_id: str
    entry_point: str | Callable[..., Env]
    description: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)

    def load(self) -> Callable[..., Env]:
        if callable(self.entry_point):
            return self.entry_point
        module, _, attr = self.entry_point.partition(":")
        if not attr:
            raise ValueError(f"entry point {self.entry_point!r} of {self.env_id} must look like 'package.module:Class'")
        return getattr(importlib.import_module(module), attr)


_REGISTRY: dict[str, EnvSpec] = {}


def register(env_id: str, entry_point: str | Callable[..., Env], *, description: str = "", **default_kwargs: Any) -> None:
    """Register ``env_id`` (``name-vN``). Registering an id twice is an error."""
    if not _ID.match(env_id):
        raise ValueError(f"env id {env_id!r} must look like 'name-v0' (lower case, a version suffix)")
    if env_id in _REGISTRY:
        raise ValueError(f"env id {env_id!r} is already registered; bump the version (e.g. '{_bump(env_id)}') for a new variant")
    _REGISTRY[env_id] = EnvSpec(env_id, entry_point, description, dict(default_kwargs))


def registered() -> dict[str, str]:
    """Every registered id with its one-line description."""
    return {k: v.description for k, v in sorted(_REGISTRY.items())}


def spec(env_id: str) -> EnvSpec:
    if env_id not in _REGISTRY:
        close = difflib.get_close_matches(env_id, list(_REGISTRY), n=1, cutoff=0.4)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise UnknownEnvError(f"unknown env id '{env_id}'.{hint} Registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[env_id]


def make(env_id: str, **kwargs: Any) -> Env:
    """Build ``env_id`` with ``kwargs`` over its registered defaults, wrapped by the standard wrappers."""
    s = spec(env_id)
    merged = {**s.kwargs, **kwargs}
    wrap = {k: merged.pop(k) for k in WRAPPER_KWARGS if k in merged}
    cls = s.load()
    _check_kwargs(env_id, cls, merged)
    env: Env = cls(**merged)
    if wrap.get("progress_reward"):
        env = OracleProgress(env, wrap["progress_reward"])
    if wrap.get("invalid_penalty"):
        env = InvalidActionPenalty(env, wrap["invalid_penalty"])
    env = TurnLimit(env, int(wrap.get("max_turns", 16)))
    return EpisodeStatistics(env)


def _check_kwargs(env_id: str, cls: Callable[..., Env], kwargs: dict[str, Any]) -> None:
    params = inspect.signature(cls).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    valid = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)] + list(WRAPPER_KWARGS)
    for k in kwargs:
        if k not in valid:
            close = difflib.get_close_matches(k, valid, n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise TypeError(f"{env_id} has no argument '{k}'.{hint} Valid: {', '.join(valid)}")


def _bump(env_id: str) -> str:
    name, _, version = env_id.rpartition("-v")
    return f"{name}-v{int(version) + 1}"
