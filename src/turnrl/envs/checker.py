"""``check_env``: what every env author runs before training on an env (Gymnasium's ``env_checker``, for text)."""

from __future__ import annotations

import asyncio
import math
import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

from turnrl.envs.base import Env

GARBAGE = "\x00 <answer></answer> this is not an action ###"
_INFO_TYPES: tuple[tuple[str, type], ...] = (("actions", list), ("valid", bool), ("success", bool), ("reward_components", dict))


class EnvCheckError(AssertionError):
    """An env breaks the contract of ``turnrl.envs.base``. The message names the property and how to fix it."""


def _require(ok: bool, what: str, fix: str) -> None:
    if not ok:
        raise EnvCheckError(f"{what}. Fix: {fix}")


def _check_reset(out: Any, where: str) -> str:
    _require(
        isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], str) and isinstance(out[1], dict),
        f"{where}: reset() returned {out!r:.80}", "return (observation: str, info: dict)",
    )
    return out[0]


def _check_step(out: Any, where: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
    _require(isinstance(out, tuple) and len(out) == 5, f"{where}: step() returned {type(out).__name__}",
             "return (observation, reward, terminated, truncated, info)")
    obs, reward, terminated, truncated, info = out
    _require(isinstance(obs, str), f"{where}: the observation is a {type(obs).__name__}", "observations are text (str)")
    _require(isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward),
             f"{where}: reward {reward!r} is not a finite number", "return a float reward")
    _require(isinstance(terminated, bool) and isinstance(truncated, bool),
             f"{where}: terminated/truncated are {type(terminated).__name__}/{type(truncated).__name__}", "return Python bools")
    _require(isinstance(info, dict), f"{where}: info is a {type(info).__name__}", "return a dict")
    for key, typ in _INFO_TYPES:
        _require(isinstance(info.get(key), typ), f"{where}: info[{key!r}] is missing or not a {typ.__name__}",
                 "set every info key listed in turnrl/envs/base.py")
    _require(all(isinstance(a, str) for a in info["actions"]), f"{where}: info['actions'] holds non-str items",
             "list the executed actions as strings")
    total = sum(info["reward_components"].values())
    _require(math.isclose(total, reward, abs_tol=1e-6),
             f"{where}: reward components {info['reward_components']} sum to {total}, not to the reward {reward}",
             "name every part of the reward in info['reward_components']")
    return obs, float(reward), terminated, truncated, info


class _Step(NamedTuple):
    """What one step showed, compared across replays."""

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    actions: list[str]
    valid: bool
    success: bool
    anchor: str


Trace = list[Any]  # the initial observation, then one _Step per step


def _rollout(env: Env, seed: int, actions: Sequence[str]) -> Trace:
    """Reset with ``seed`` and play ``actions`` until the episode ends; the observed trajectory."""
    trace: Trace = [(_check_reset(env.reset(seed=seed), f"reset(seed={seed})"),)]
    for text in actions:
        obs, reward, terminated, truncated, info = _check_step(env.step(text), f"seed {seed}, step({text!r})")
        trace.append(_Step(obs, reward, terminated, truncated, info["actions"], info["valid"], info["success"], env.anchor()))
        if terminated or truncated:
            break
    return trace


async def _arollout(env: Env, seed: int, actions: Sequence[str]) -> Trace:
    """``_rollout`` through ``areset``/``astep``."""
    trace: Trace = [(_check_reset(await env.areset(seed=seed), f"areset(seed={seed})"),)]
    for text in actions:
        obs, reward, terminated, truncated, info = _check_step(await env.astep(text), f"seed {seed}, astep({text!r})")
        trace.append(_Step(obs, reward, terminated, truncated, info["actions"], info["valid"], info["success"], env.anchor()))
        if terminated or truncated:
            break
    return trace


def check_env(
    env_or_id: Env | str,
    seeds: Sequence[int] = (0, 1, 2),
    *,
    check_solve: bool = True,
    random_tasks: bool | None = None,
    **make_kwargs: Any,
) -> None:
    """Raise :class:`EnvCheckError` unless the env keeps the contract of ``turnrl.envs.base``.

    For each seed: ``reset`` returns ``(str, dict)`` and the same observation twice; ``anchor()`` is a str;
    the same actions give the same trajectory (observations, rewards, flags, info keys, anchors), played
    through ``reset``/``step`` twice and through ``areset``/``astep`` once; every ``step`` returns the
    documented types and info keys with reward components summing to the reward; garbage text gives
    ``valid=False`` without raising and leaves the anchor unchanged; following ``solve()`` (when
    implemented) reaches success. Then ``close()`` is called twice.

    The actions played are the oracle's plan, else the responses of ``examples()``, else garbage text.

    Args:
        env_or_id: an env instance, or a registered id built with ``make(env_or_id, **make_kwargs)``.
        seeds: the seeds to check; use at least two distinct ones for the ``random_tasks`` check.
        check_solve: require the oracle's plan to succeed; pass False for stochastic dynamics (slippery
            FrozenLake), where a shortest deterministic plan may fail.
        random_tasks: True: different seeds must give some different initial observations (an env whose
            task depends on the seed); False: skip that check; None: only warn when all seeds look alike.
    """
    from turnrl.envs.registry import make

    env = make(env_or_id, **make_kwargs) if isinstance(env_or_id, str) else env_or_id
    try:
        initial: dict[int, str] = {}
        for seed in seeds:
            initial[seed] = _check_reset(env.reset(seed=seed), f"reset(seed={seed})")
            _require(isinstance(env.anchor(), str), "anchor() does not return a str", "return a text key of the current state")
            _require(_check_reset(env.reset(seed=seed), f"reset(seed={seed})") == initial[seed],
                     f"reset(seed={seed}) twice gave different observations",
                     "draw every random choice from an RNG seeded in reset(seed=...), never the global RNG")
            try:
                plan = env.solve()
            except NotImplementedError:
                plan = None
            actions = list(plan) if plan else [response for _, response in env.examples()] or [GARBAGE] * 3
            first = _rollout(env, seed, actions)
            _require(first == _rollout(env, seed, actions), f"seed {seed}: the same actions gave different trajectories",
                     "seed every random draw (including the dynamics) from reset(seed=...)")
            _require(first == asyncio.run(_arollout(env, seed, actions)), f"seed {seed}: areset/astep disagree with reset/step",
                     "make areset/astep run the same logic as reset/step (or leave the base-class defaults)")
            if check_solve and plan:
                _require(first[-1].success, f"seed {seed}: following solve() = {plan} did not reach success",
                         "solve() must return a plan that succeeds from the current state (and fits the turn limit)")
            env.reset(seed=seed)
            before = env.anchor()
            try:
                out = env.step(GARBAGE)
            except Exception as e:
                raise EnvCheckError(
                    f"step() raised {type(e).__name__}: {e} on garbage text. Fix: never raise on model text; "
                    "answer with feedback in the observation and info['valid']=False"
                ) from e
            _, _, terminated, _, info = _check_step(out, f"seed {seed}, garbage text")
            _require(not info["valid"] and not info["actions"], "garbage text was accepted as a valid action",
                     "set info['valid']=False and info['actions']=[] when no action parses")
            _require(env.anchor() == before and not terminated, "garbage text changed the state",
                     "leave the state unchanged on invalid text and answer with feedback in the observation")
        if len(set(initial.values())) == 1 and len(initial) > 1:
            message = f"seeds {list(initial)} all gave the same initial observation"
            _require(random_tasks is not True, message, "build the task from the RNG seeded in reset(seed=...)")
            if random_tasks is None:
                warnings.warn(f"{message}; fine for a fixed task, pass random_tasks=False to silence this", stacklevel=2)
        env.close()
        env.close()
    finally:
        env.close()
