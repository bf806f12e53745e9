"""``check_env``: what every env author runs before training on an env (Gymnasium's ``env_checker``, for text).

Every call into the env runs guarded: an exception or a call that outlives ``step_timeout_s`` becomes an
:class:`EnvCheckError` naming the call, what went wrong and the fix, so ``check_env`` itself never raises
anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from turnrl.envs.base import Env
from turnrl.envs.fuzz import fuzz_action
from turnrl.envs.tools.env import ToolTimeout, run_with_timeout

GARBAGE = "\x00 <answer></answer> this is not an action ###"
_INFO_TYPES: tuple[tuple[str, type], ...] = (("actions", list), ("valid", bool), ("success", bool), ("reward_components", dict))
_FIX_MODEL_TEXT = "never raise on model text; answer with feedback in the observation and info['valid']=False"
_FIX_SEEDED = "draw every random choice from an RNG seeded in reset(seed=...), never the global RNG"

StepResult = tuple[str, float, bool, bool, dict[str, Any]]


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


def _check_step(out: Any, where: str) -> StepResult:
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
    components = info["reward_components"].values()
    _require(all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in components),
             f"{where}: reward components {info['reward_components']!r:.80} are not all numbers", "name each part with a float")
    total = sum(components)
    _require(math.isclose(total, reward, abs_tol=1e-6),
             f"{where}: reward components {info['reward_components']} sum to {total}, not to the reward {reward}",
             "name every part of the reward in info['reward_components']")
    return obs, float(reward), terminated, truncated, info


def _describe(error: BaseException) -> str:
    """``"KeyError: 'valid'"``, on one line and at most 200 characters."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"[:200]


def _fix_for(error: BaseException, fix: str) -> str:
    info_keys = [key for key, _ in _INFO_TYPES]
    if isinstance(error, KeyError) and error.args and error.args[0] in info_keys:
        return (f"step() must return info[{error.args[0]!r}] (the wrappers and the collector read it); "
                "set every info key listed in turnrl/envs/base.py")
    return fix


class _Probe:
    """The env under test, called through guards: an exception or a call slower than ``timeout_s`` is an EnvCheckError."""

    def __init__(self, env: Env, timeout_s: float) -> None:
        self.env, self.timeout_s = env, timeout_s

    def call(self, what: str, fix: str, fn: Callable[[], Any], timeout_s: float | None = None) -> Any:
        limit = timeout_s or self.timeout_s
        try:
            return run_with_timeout(fn, {}, limit or None)  # 0: no limit
        except ToolTimeout:
            raise EnvCheckError(
                f"{what} did not return within {limit:g} s. Fix: bound the work one call does (parsing, tools, "
                "subprocesses), or pass a larger step_timeout_s if it is slow by nature"
            ) from None
        except EnvCheckError:
            raise
        except Exception as e:  # noqa: BLE001 - every failure is reported as a broken property
            raise EnvCheckError(f"{what} raised {_describe(e)}. Fix: {_fix_for(e, fix)}") from e

    def reset(self, seed: int) -> str:
        where = f"reset(seed={seed})"
        fix = "reset(seed=...) must build the task for any seed without raising"
        return _check_reset(self.call(where, fix, functools.partial(self.env.reset, seed=seed)), where)

    def step(self, text: str, where: str, fix: str = _FIX_MODEL_TEXT) -> StepResult:
        return _check_step(self.call(f"{where}: step({text!r:.60})", fix, functools.partial(self.env.step, text)), where)

    def anchor(self) -> str:
        key = self.call("anchor()", "implement anchor(): a text key of the current state", self.env.anchor)
        _require(isinstance(key, str), f"anchor() returned a {type(key).__name__}", "return a text key of the current state")
        return key

    def situation(self) -> None:
        """``situation()`` is optional; when an env defines it, it returns a str."""

        def situation() -> str | None:
            try:
                return self.env.situation()
            except NotImplementedError:
                return None

        key = self.call("situation()", "return a text key of what the agent faces, or leave it undefined", situation)
        _require(key is None or isinstance(key, str), f"situation() returned a {type(key).__name__}",
                 "return a text key of what the agent faces now (neighbour cells, goal direction, ...)")

    def task_key(self) -> str:
        key = self.call("task_key()", "return the key of the task drawn by the last reset", self.env.task_key)
        _require(isinstance(key, str), f"task_key() returned a {type(key).__name__}",
                 "return a str naming the task (map layout, puzzle, question id, ...)")
        return key

    def plan(self) -> list[str] | None:
        """``solve()``, or None when the env has no oracle (or it returns None)."""

        def solve() -> list[str] | None:
            try:
                return self.env.solve()
            except NotImplementedError:
                return None

        plan = self.call("solve()", "return a list of responses, None (no plan), or raise NotImplementedError", solve)
        _require(plan is None or (isinstance(plan, list) and all(isinstance(a, str) for a in plan)),
                 f"solve() returned {plan!r:.80}", "return a list of response texts or None")
        return plan

    def examples(self) -> list[str]:
        """The responses of ``examples()``."""
        pairs = self.call("examples()", "return a list of (observation, response) pairs", self.env.examples)
        _require(isinstance(pairs, list) and all(isinstance(p, tuple) and len(p) == 2 and all(isinstance(x, str) for x in p)
                                                 for p in pairs),
                 f"examples() returned {pairs!r:.80}", "return a list of (observation: str, response: str) pairs")
        return [response for _, response in pairs]


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


def _rollout(probe: _Probe, seed: int, actions: Sequence[str]) -> Trace:
    """Reset with ``seed`` and play ``actions`` until the episode ends; the observed trajectory."""
    trace: Trace = [(probe.reset(seed),)]
    for text in actions:
        obs, reward, terminated, truncated, info = probe.step(text, f"seed {seed}")
        trace.append(_Step(obs, reward, terminated, truncated, info["actions"], info["valid"], info["success"], probe.anchor()))
        if terminated or truncated:
            break
    return trace


async def _arollout(env: Env, seed: int, actions: Sequence[str]) -> Trace:
    """``_rollout`` through ``areset``/``astep`` (run by ``_Probe.call``, which reports what they raise)."""
    trace: Trace = [(_check_reset(await env.areset(seed=seed), f"areset(seed={seed})"),)]
    for text in actions:
        obs, reward, terminated, truncated, info = _check_step(await env.astep(text), f"seed {seed}, astep({text!r:.60})")
        trace.append(_Step(obs, reward, terminated, truncated, info["actions"], info["valid"], info["success"], env.anchor()))
        if terminated or truncated:
            break
    return trace


def _check_seed(probe: _Probe, seed: int, check_solve: bool) -> str:
    """The per-seed checks (see :func:`check_env`); returns the seed's task key."""
    initial = probe.reset(seed)
    probe.anchor()
    probe.situation()
    key = probe.task_key()
    _require(probe.reset(seed) == initial, f"reset(seed={seed}) twice gave different observations", _FIX_SEEDED)
    _require(probe.task_key() == key, f"reset(seed={seed}) twice gave different task keys", _FIX_SEEDED)
    plan = probe.plan()
    actions = list(plan) if plan else probe.examples() or [GARBAGE] * 3
    first = _rollout(probe, seed, actions)
    after = probe.task_key()
    _require(after == key, f"seed {seed}: task_key() changed during the episode ({key!r:.60} -> {after!r:.60})",
             "key the task drawn by reset, not the current state (that is anchor())")
    _require(first == _rollout(probe, seed, actions), f"seed {seed}: the same actions gave different trajectories",
             "seed every random draw (including the dynamics) from reset(seed=...)")
    replay = probe.call(f"seed {seed}: areset/astep", "make areset/astep run the same logic as reset/step",
                        lambda: asyncio.run(_arollout(probe.env, seed, actions)), probe.timeout_s * (len(actions) + 1))
    _require(first == replay, f"seed {seed}: areset/astep disagree with reset/step",
             "make areset/astep run the same logic as reset/step (or leave the base-class defaults)")
    if check_solve and plan:
        _require(first[-1].success, f"seed {seed}: following solve() = {plan} did not reach success",
                 "solve() must return a plan that succeeds from the current state (and fits the turn limit)")
    probe.reset(seed)
    before = probe.anchor()
    _, _, terminated, _, info = probe.step(GARBAGE, f"seed {seed}, garbage text")
    _require(not info["valid"] and not info["actions"], "garbage text was accepted as a valid action",
             "set info['valid']=False and info['actions']=[] when no action parses")
    _require(probe.anchor() == before and not terminated, "garbage text changed the state",
             "leave the state unchanged on invalid text and answer with feedback in the observation")
    return key


def _check_fuzz(probe: _Probe, seeds: Sequence[int], cases: int, fuzz_seed: int) -> None:
    """Case ``i`` of the hostile stream ``fuzz_seed`` (:mod:`turnrl.envs.fuzz`), each from a fresh reset, must return a
    well-formed step within the time limit."""
    samples = probe.examples()
    for i in range(cases):
        seed = seeds[i % len(seeds)]
        probe.reset(seed)
        where = (f"fuzz case {i} after reset(seed={seed}) (reproduce: env.reset(seed={seed}); env.step(turnrl.envs.fuzz."
                 f"fuzz_action({fuzz_seed}, {i}, [r for _, r in env.examples()])))")
        probe.step(fuzz_action(fuzz_seed, i, samples), where)


def _build(env_or_id: Env | str, make_kwargs: dict[str, Any]) -> Env:
    from turnrl.envs.registry import make

    if not isinstance(env_or_id, str):
        return env_or_id
    try:
        return make(env_or_id, **make_kwargs)
    except Exception as e:  # noqa: BLE001 - reported with the id and keywords
        raise EnvCheckError(
            f"make({env_or_id!r}, **{make_kwargs}) raised {_describe(e)}. Fix: register the id (or pass an env instance) "
            "and pass keywords its constructor takes"
        ) from e


def check_env(
    env_or_id: Env | str,
    seeds: Sequence[int] = (0, 1, 2),
    *,
    check_solve: bool = True,
    random_tasks: bool | None = None,
    fuzz: int = 27,
    fuzz_seed: int = 0,
    step_timeout_s: float = 60.0,
    **make_kwargs: Any,
) -> None:
    """Raise :class:`EnvCheckError` unless the env keeps the contract of ``turnrl.envs.base``.

    For each seed: ``reset`` returns ``(str, dict)`` and the same observation and task key twice; ``anchor()``
    and ``task_key()`` are str (``situation()`` too, when defined); the same actions give the same trajectory (observations, rewards, flags, info
    keys, anchors), played through ``reset``/``step`` twice and through ``areset``/``astep`` once, and leave the
    task key unchanged; every ``step`` returns the documented types and info keys with reward components
    summing to the reward; garbage text gives ``valid=False`` without raising and leaves the anchor unchanged;
    following ``solve()`` (when implemented) reaches success. Then the fuzz stage: ``fuzz`` cases of hostile
    text (:mod:`turnrl.envs.fuzz`), each after a fresh reset, must each give a well-formed step (an invalid turn
    where nothing parses) without raising. Every call must return within ``step_timeout_s``. Then ``close()``
    is called twice. A multi-agent env is checked by :func:`turnrl.envs.multiagent.check_multiagent_env` instead.

    The actions played are the oracle's plan, else the responses of ``examples()``, else garbage text.

    Args:
        env_or_id: an env instance, or a registered id built with ``make(env_or_id, **make_kwargs)``.
        seeds: the seeds to check; use at least two distinct ones for the ``random_tasks`` check.
        check_solve: require the oracle's plan to succeed; pass False for stochastic dynamics (slippery
            FrozenLake), where a shortest deterministic plan may fail.
        random_tasks: True: different seeds must give some different task keys (an env whose task depends
            on the seed); False: skip that check; None: only warn when all seeds give one task key.
        fuzz: how many hostile actions to play (0: skip the fuzz stage); every kind appears once it is >= 9.
        fuzz_seed: the stream of hostile actions; a failure names it and the case, to reproduce it.
        step_timeout_s: the time limit of one call into the env, as the collector's default ``env.step_timeout_s``
            (0: no limit).
    """
    env = _build(env_or_id, make_kwargs)
    from turnrl.envs.multiagent import MultiAgentEnv, check_multiagent_env  # it imports this module

    if isinstance(env, MultiAgentEnv):
        return check_multiagent_env(env, seeds, check_solve=check_solve)
    probe = _Probe(env, step_timeout_s)
    try:
        keys = {seed: _check_seed(probe, seed, check_solve) for seed in seeds}
        if len(keys) > 1 and len(set(keys.values())) == 1:
            message = f"seeds {list(keys)} all gave the same task (task_key() {next(iter(keys.values()))!r:.60})"
            _require(random_tasks is not True, message, "build the task from the RNG seeded in reset(seed=...); if tasks "
                     "differ only in hidden state (a secret), override task_key() to include it")
            if random_tasks is None:
                warnings.warn(f"{message}; fine for a fixed task, pass random_tasks=False to silence this (if tasks differ "
                              "only in hidden state, override task_key() to include it)", stacklevel=2)
        _check_fuzz(probe, list(seeds), fuzz, fuzz_seed)
        for _ in range(2):
            probe.call("close()", "make close() safe to call more than once", env.close)
    finally:
        with contextlib.suppress(Exception):  # the env is already reported broken, or was closed above
            env.close()
