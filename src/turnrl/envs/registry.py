"""Register environments by versioned string id with a lazy ``"module:Class"`` entry point.

    register("frozenlake-v0", "turnrl.envs.frozenlake:FrozenLake", description="...", max_turns=8)
    env = make("frozenlake-v0", slippery=True, max_turns=12)

Ids look like ``name-vN`` (lower case letters, digits, ``_ . -``, then a version): a changed env gets a new
version rather than silently changing an old id. The entry point is imported on the first ``make``.

An unregistered env class can be made by its location, ``make("mypkg.envs:Guess", **kwargs)``: a
``module:Class`` id builds that class with no registered defaults (the module must be importable: installed,
in the current directory when run by the ``turnrl`` command, or on ``PYTHONPATH``).

Installed distributions add envs through the ``turnrl.envs`` entry-point group (:func:`discover`), read with
:mod:`importlib.metadata` the first time the registry is listed or an id is looked up: each entry point's name is
an env id and its value the ``"module:Class"`` that builds it, so ``pip install my-env`` makes ``make("my-env-v0")``
work without importing anything until then. ``turnrl init env NAME`` writes such a package.

``make`` builds the env from its entry point with the keyword arguments over the registered defaults, and
wraps it with the standard wrappers, configured by the keywords that belong to them (the rest go to the
env's constructor), innermost first:

- ``reward="success"`` -> :class:`SuccessReward` (default ``"env"``: the env's own reward);
- ``progress_reward`` -> :class:`OracleProgress` (default 0: not applied), unless the env's constructor takes
  ``progress_reward`` itself (the hierarchies shape the env they wrap, so planner and executor both get it);
- ``invalid_penalty`` -> :class:`InvalidActionPenalty` (default 0: not applied);
- ``max_turns`` -> :class:`TurnLimit` (default: the registration's, else ``DEFAULT_MAX_TURNS``);
- :class:`EpisodeStatistics`, always (outermost, so it sees every other wrapper's reward and truncation).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from turnrl.envs.base import Env
from turnrl.envs.multiagent import MultiAgentEnv, wrap as wrap_multiagent
from turnrl.envs.wrappers import EpisodeStatistics, InvalidActionPenalty, OracleProgress, SuccessReward, TurnLimit

DEFAULT_MAX_TURNS = 16
WRAPPER_KWARGS = ("max_turns", "invalid_penalty", "progress_reward", "reward")
REWARDS = ("env", "success")
_ID = re.compile(r"^[a-z0-9][a-z0-9_.-]*-v\d+$")
_ENTRY_POINT = re.compile(r"^[\w.]+:\w+$")
ENTRY_POINT_GROUP = "turnrl.envs"


class UnknownEnvError(KeyError):
    """``make`` or ``spec`` got an id that is not registered; the message lists the registered ids."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0])


class EnvLoadError(ImportError):
    """An entry point's module cannot be found or has no such class; the message says how to fix it."""


@dataclass
class EnvSpec:
    """A registration: the id, where the env class lives, and the default keyword arguments for ``make``."""

    env_id: str
    entry_point: str | Callable[..., Env]
    description: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    distribution: importlib.metadata.Distribution | None = None  # the installed package declaring it (entry points)

    def load(self) -> Callable[..., Env]:
        """The env class (or factory), importing its module on first use.

        Raises :class:`EnvLoadError` when the module is not importable or lacks the class; errors raised by the
        module's own code while it is imported propagate unchanged, except for an env an installed distribution
        declares, where any error is an :class:`EnvLoadError` naming the distribution and the fix.
        """
        if self.distribution is not None:
            return self._load_declared(self.distribution)
        return self._import()

    def _load_declared(self, dist: importlib.metadata.Distribution) -> Callable[..., Env]:
        """The class an installed distribution's entry point names; any failure is one line naming the distribution."""
        module, _, attr = str(self.entry_point).partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except Exception as e:  # noqa: BLE001 - a broken package, whatever its code raised
            name = dist.metadata["Name"]
            reason = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            raise EnvLoadError(
                f"env '{self.env_id}' of the installed distribution {_named(dist)} does not load: '{self.entry_point}' "
                f"raised {reason}. Fix: reinstall it (pip install --force-reinstall {name}), correct its "
                f"[project.entry-points.\"{ENTRY_POINT_GROUP}\"] in pyproject.toml, or uninstall it (pip uninstall {name})"
            ) from e

    def _import(self) -> Callable[..., Env]:
        if callable(self.entry_point):
            return self.entry_point
        name, _, attr = self.entry_point.partition(":")
        where = f"env '{self.env_id}'" + (f" ('{self.entry_point}')" if self.entry_point != self.env_id else "")
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is None or not (name == e.name or name.startswith(e.name + ".")):
                raise  # the module exists; one of its own imports is missing
            raise EnvLoadError(
                f"cannot load {where}: no module named '{e.name}'. Make it importable: run turnrl from the directory "
                "that holds it (or pass --import MODULE, or set PYTHONPATH=<that directory>), or install it"
            ) from None
        if not hasattr(module, attr):
            classes = [k for k, v in sorted(vars(module).items()) if inspect.isclass(v) and issubclass(v, Env) and v.__module__ == name]
            raise EnvLoadError(
                f"cannot load {where}: module '{name}' has no '{attr}'. Env classes there: {', '.join(classes) or 'none'}"
            )
        return getattr(module, attr)


_REGISTRY: dict[str, EnvSpec] = {}
_PROBLEMS: list[str] | None = None  # what the last discover() could not register; None before the first


def register(env_id: str, entry_point: str | Callable[..., Env], *, description: str = "", **default_kwargs: Any) -> None:
    """Register ``env_id`` (``name-vN``) built by ``entry_point`` (``"package.module:Class"`` or a callable).

    ``default_kwargs`` are the defaults for :func:`make` (constructor and wrapper keywords alike).
    Raises ``ValueError`` for a malformed id or entry point, or an id that is already registered.
    """
    if not _ID.match(env_id):
        raise ValueError(f"env id {env_id!r} must look like 'name-v0' (lower case letters, digits, '_', '.', '-', then -vN)")
    if env_id in _REGISTRY:
        raise ValueError(f"env id {env_id!r} is already registered; register a new version (e.g. '{_bump(env_id)}') instead")
    if isinstance(entry_point, str) and not _ENTRY_POINT.match(entry_point):
        raise ValueError(f"entry point {entry_point!r} of {env_id} must look like 'package.module:Class'")
    _REGISTRY[env_id] = EnvSpec(env_id, entry_point, description, dict(default_kwargs))


def discover() -> list[str]:
    """Register the envs of installed distributions (the ``turnrl.envs`` entry-point group); returns one line per
    entry point that could not be registered, naming its distribution and the fix.

    An entry point ``"my-env-v0" = "my_env.env:MyEnv"`` registers ``my-env-v0`` lazily (nothing is imported before
    ``make``), described by the distribution's summary. A malformed name or value, or an id taken by another env, is
    skipped and reported; the other envs are unaffected. :func:`registered` and :func:`spec` call this once, on
    first use; call it again to see distributions installed since (it re-registers nothing).
    """
    global _PROBLEMS
    _PROBLEMS = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        known = _REGISTRY.get(ep.name)
        if known is not None and known.distribution is not None and _named(known.distribution) == _named(ep.dist):
            continue  # registered by an earlier discover()
        try:
            register(ep.name, ep.value, description=_summary(ep.dist))
        except ValueError as e:
            name = ep.dist.metadata["Name"]
            _PROBLEMS.append(
                f"the installed distribution {_named(ep.dist)} declares the env {ep.name} = {ep.value}, skipped: {e}. Fix: "
                f"correct its [project.entry-points.\"{ENTRY_POINT_GROUP}\"] in pyproject.toml and reinstall it, or "
                f"uninstall it (pip uninstall {name})")
            continue
        _REGISTRY[ep.name].distribution = ep.dist
    return list(_PROBLEMS)


def _discovered() -> list[str]:
    """The problems of the first :func:`discover`, running it if it has not run."""
    return list(_PROBLEMS) if _PROBLEMS is not None else discover()


def _named(dist: importlib.metadata.Distribution) -> str:
    return f"'{dist.metadata['Name']}' {dist.version}"


def _summary(dist: importlib.metadata.Distribution) -> str:
    summary = dist.metadata["Summary"] or "no description"
    return f"{summary} (installed package {dist.metadata['Name']} {dist.version})"


def registered() -> dict[str, str]:
    """Every registered id (sorted) with its one-line description, installed distributions' envs included."""
    _discovered()
    return {env_id: s.description for env_id, s in sorted(_REGISTRY.items())}


def spec(env_id: str) -> EnvSpec:
    """The registration of ``env_id`` (a ``module:Class`` id: an unregistered spec of that class).

    Raises :class:`UnknownEnvError`, naming the closest id, listing the registered ones and saying how to add one
    (and which installed env packages could not be registered, if any).
    """
    problems = _discovered()
    if env_id in _REGISTRY:
        return _REGISTRY[env_id]
    if _ENTRY_POINT.match(env_id):
        return EnvSpec(env_id, env_id, f"{env_id} (not registered)")
    close = difflib.get_close_matches(env_id, list(_REGISTRY), n=1, cutoff=0.4)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    skipped = "".join(f" Not registered: {p}" for p in problems)
    raise UnknownEnvError(
        f"unknown env id '{env_id}'.{hint} Registered: {', '.join(sorted(_REGISTRY))}. For your own env, call "
        "register('name-v0', 'package.module:Class') in a module you import, use the id 'package.module:Class', or "
        f"install a package declaring it (turnrl init env NAME writes one).{skipped}"
    )


def make(env_id: str, **kwargs: Any) -> Env:
    """Build ``env_id`` (a registered id or ``module:Class``) with ``kwargs`` over its registered defaults, wrapped
    by the standard wrappers.

    Raises :class:`UnknownEnvError` for an unknown id, :class:`EnvLoadError` for an entry point that cannot be
    imported, and ``TypeError`` naming the keyword (and the valid ones) when a keyword is neither a constructor
    argument nor a wrapper keyword.
    """
    s = spec(env_id)
    merged = {**s.kwargs, **kwargs}
    wrapper_kwargs = {k: merged.pop(k) for k in WRAPPER_KWARGS if k in merged}
    factory = s.load()
    if "progress_reward" in wrapper_kwargs and "progress_reward" in inspect.signature(factory).parameters:
        merged["progress_reward"] = wrapper_kwargs.pop("progress_reward")  # the env shapes itself
    _check_kwargs(env_id, factory, merged)
    reward = wrapper_kwargs.pop("reward", "env")
    if reward not in REWARDS:
        raise ValueError(f"{env_id}: reward={reward!r} is not one of {REWARDS}; 'env' keeps the env's own reward, "
                         "'success' pays 1 on success and 0 otherwise")
    env = factory(**merged)
    if isinstance(env, MultiAgentEnv):  # its own turn limit and penalty (envs/multiagent.py)
        if reward != "env":
            raise ValueError(f"{env_id} is multi-agent: reward='success' is single-agent only (each role has its own "
                             "reward); set env.reward=env")
        return wrap_multiagent(env, int(wrapper_kwargs.pop("max_turns", DEFAULT_MAX_TURNS)), **wrapper_kwargs)
    if reward == "success":
        env = SuccessReward(env)
    if wrapper_kwargs.get("progress_reward"):
        env = OracleProgress(env, wrapper_kwargs["progress_reward"])
    if wrapper_kwargs.get("invalid_penalty"):
        env = InvalidActionPenalty(env, wrapper_kwargs["invalid_penalty"])
    env = TurnLimit(env, int(wrapper_kwargs.get("max_turns", DEFAULT_MAX_TURNS)))
    return EpisodeStatistics(env)


def _check_kwargs(env_id: str, factory: Callable[..., Env], kwargs: dict[str, Any]) -> None:
    params = inspect.signature(factory).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    valid = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)] + list(WRAPPER_KWARGS)
    for name in kwargs:
        if name not in valid:
            close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise TypeError(f"{env_id} has no argument '{name}'.{hint} Valid arguments: {', '.join(valid)}")


def _bump(env_id: str) -> str:
    name, _, version = env_id.rpartition("-v")
    return f"{name}-v{int(version) + 1}"
