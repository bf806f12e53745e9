"""``check_env``: what every env author runs before training on an env (Gymnasium's env_checker, for text)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from turnrl.envs.base import Env


class EnvCheckError(AssertionError):
    """An env breaks the contract. The message names the property and how to fix it."""


def _fail(what: str, fix: str) -> None:
    raise EnvCheckError(f"{what}. Fix: {fix}")


def _check_step(out: Any, where: str) -> tuple[str, float, bool, bool, dict]:
    if not (isinstance(out, tuple) and len(out) == 5):
        _fail(f"{where}: step() returned {type(out).__name__}", "return (observation, reward, terminated, truncated, info)")
    obs, reward, terminated, truncated, info = out
    if not isinstance(obs, str):
        _fail(f"{where}: observation is {type(obs).__name__}", "observations are text (str)")
    if not isinstance(reward, (int, float)) or not math.isfinite(reward):
        _fail(f"{where}: reward {reward!r} is not a finite number", "return a float reward")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        _fail(f"{where}: terminated/truncated must be bool, got {type(terminated).__name__}/{type(truncated).__name__}", "return Python bools")
    if not isinstance(info, dict):
        _fail(f"{where}: info is {type(info).__name__}", "return a dict")
    for key, typ in (("actions", list), ("valid", bool), ("success", bool), ("reward_components", dict)):
        if key not in info or not isinstance(info[key], typ):
            _fail(f"{where}: info[{key!r}] missing or not {typ.__name__}", "see the info keys in turnrl/envs/base.py")
    total = sum(info["reward_components"].values())
    if abs(total - reward) > 1e-6:
        _fail(f"{where}: reward components {info['reward_components']} sum to {total}, not the reward {reward}",
              "name every part of the reward in info['reward_components']")
    return obs, float(reward), terminated, truncated, info


def _rollout(env: Env, seed: int, actions: Sequence[str]) -> list[tuple]:
    obs, _ = env.reset(seed=seed)
    trace: list[tuple] = [(obs,)]
    for a in actions:
        out = _check_step(env.step(a), f"seed {seed}")
        trace.append(out[:4] + (out[4]["actions"], out[4]["valid"], out[4]["success"]))
        if out[2] or out[3]:
            break
    return trace


def check_env(env_or_id: Env | str, seeds: Sequence[int] = (0, 1, 2), *, check_solve: bool = True, **make_kwargs: Any) -> None:
    """Raise :class:`EnvCheckError` unless the env keeps the contract of ``turnrl.envs.base``.

    Checks: reset types; seeded determinism (same seed and actions give the same trajectory); invalid text
    gives ``valid=False`` instead of an exception; reward components sum to the reward; ``anchor()`` is a
    str; ``solve()`` (when implemented) reaches success (pass ``check_solve=False`` for stochastic dynamics,
    where a shortest deterministic plan may fail); ``areset``/``astep`` agree with the sync methods;
    ``close()`` can be called twice.
    """
    from turnrl.envs.registry import make

    def build() -> Env:
        return make(env_or_id, **make_kwargs) if isinstance(env_or_id, str) else env_or_id

    env = build()
    try:
        for seed in seeds:
            out = env.reset(seed=seed)
            if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], str) and isinstance(out[1], dict)):
                _fail(f"reset(seed={seed}) returned {out!r:.80}", "return (observation: str, info: dict)")
            if not isinstance(env.anchor(), str):
                _fail("anchor() is not a str", "return a hashable text key of the current state")
            obs_again, _ = env.reset(seed=seed)
            if obs_again != out[0]:
                _fail(f"reset(seed={seed}) twice gave different observations", "draw everything from an RNG seeded in reset()")
            try:
                plan = env.solve()
            except NotImplementedError:
                plan = None
            actions = list(plan) if plan else ["<nothing valid here>"] * 3
            first, second = _rollout(env, seed, actions), _rollout(env, seed, actions)
            if first != second:
                _fail(f"seed {seed}: the same actions gave different trajectories", "seed every random draw from reset(seed)")
            if check_solve and plan and not first[-1][-1]:
                _fail(f"seed {seed}: following solve() did not reach success", "solve() must return a plan that succeeds")
            env.reset(seed=seed)
            bad = _check_step(env.step("\x00 this is not an action ###"), f"seed {seed} (garbage text)")
            if bad[4]["valid"]:
                _fail("garbage text was accepted as a valid action", "set info['valid']=False when no action parses")
            a_obs, _ = asyncio.run(env.areset(seed=seed))
            if a_obs != out[0]:
                _fail("areset() disagrees with reset()", "make areset run the same logic as reset")
        env.close()
        env.close()
    finally:
        env.close()
