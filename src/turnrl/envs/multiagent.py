"""The multi-agent env contract: N agents with roles, per-agent observations, rewards and endings, text in and out.

A :class:`MultiAgentEnv` is one task that several agents work on (a team sharing split information, two players of
a game). Each agent is a **role** (``"speaker"``, ``"first"``): a name, its own system prompt (the role prompt,
``role_instructions[role]``) and its own view of the task. One step:

1. ``acting()`` names the roles that move now: one role when agents take turns, several for simultaneous moves,
   none once every role is done. Only roles that are not done act.
2. ``step({role: response text})`` takes one response from exactly each acting role and returns a
   :class:`MultiStep`, whose dicts have these keys:

   - ``observations``: a new observation for each role whose view changed (the role answers its newest one the
     next time it acts; a role absent here keeps its last one);
   - ``rewards``, ``terminated``, ``truncated``, ``infos``: one entry for *every* role. A reward may go to a role
     that did not act (the loser of a game when the winner moves); the collector adds it to that role's last turn.
     ``terminated`` / ``truncated`` mean for a role what they mean in :mod:`turnrl.envs.base`: a terminal state of
     the task for it, or a limit that stopped it. A done role stays done and no longer acts.
   - ``infos[role]`` holds ``"success"`` (bool: the role's verifier: the team solved the task, the player won) and
     ``"reward_components"`` (named parts summing to ``rewards[role]``); an acting role's also holds ``"actions"``
     (what was parsed and executed) and ``"valid"`` (False: no valid action; the env answers with feedback in that
     role's observation, leaves the task's state unchanged and lets the role act again; it never raises).

**Messages are actions.** An agent talks to another by an action its env defines (``SAY <text>``, or a whole
response of a role whose only action is to speak); the env puts ``"<sender>: <text>"`` into the recipients' next
observations. Nothing else carries information between agents: each sees only its own observations.

``anchor(role)`` is the state as ``role`` sees it now (what a counterfactual baseline compares), ``task_key()`` what
makes two tasks the same (:meth:`turnrl.envs.base.Env.task_key`), ``oracle(role)`` the response a perfect agent
playing ``role`` sends now, using only what that role has observed (a team of oracles shows what the task allows;
an oracle that ignored messages could not solve a split-information task). ``rule(role)``, optional, is the simple
fixed rule's response: valid, not clever (a scripted self-play opponent that never forfeits).

Envs are built by :func:`turnrl.envs.make` like any other; instead of the single-agent wrappers they get
:class:`TurnLimit` (``max_turns`` joint steps) and :class:`InvalidPenalty` (``invalid_penalty`` per invalid response),
through :func:`wrap`. ``check_env`` checks the contract (:func:`check_multiagent_env`). Envs here compute and answer
inline (no ``blocking_io``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from turnrl.envs.checker import GARBAGE, EnvCheckError


@dataclass
class MultiStep:
    """What one joint step returns (module docstring): new observations for some roles, the rest for every role."""

    observations: dict[str, str]
    rewards: dict[str, float]
    terminated: dict[str, bool]
    truncated: dict[str, bool]
    infos: dict[str, dict[str, Any]] = field(default_factory=dict)


class MultiAgentEnv:
    """Base class of multi-agent envs (module docstring). Class attributes an env sets:

    - ``roles``: the agents' names, in a fixed order;
    - ``role_instructions``: each role's system prompt (the task, its part in it and its action format).
    """

    roles: ClassVar[tuple[str, ...]] = ()
    role_instructions: ClassVar[Mapping[str, str]] = {}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        """Start an episode (the same ``seed`` gives the same task); returns every role's first observation and an info."""
        raise NotImplementedError

    def acting(self) -> tuple[str, ...]:
        """The roles that act at this step, in ``roles`` order; empty once every role is done."""
        raise NotImplementedError

    def step(self, actions: Mapping[str, str]) -> MultiStep:
        """Apply one response per acting role (exactly those roles); see the module docstring."""
        raise NotImplementedError

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        return self.reset(seed=seed, options=options)

    async def astep(self, actions: Mapping[str, str]) -> MultiStep:
        return self.step(actions)

    def anchor(self, role: str) -> str:
        """The current state as ``role`` sees it, without history."""
        raise NotImplementedError

    def task_key(self) -> str:
        """What makes two tasks the same, hidden parts included; fixed for the episode."""
        raise NotImplementedError

    def oracle(self, role: str) -> str:
        """The response a perfect agent playing ``role`` sends now, from what ``role`` has observed."""
        raise NotImplementedError

    def rule(self, role: str) -> str:
        """Optional: the response of the simplest fixed rule that plays ``role`` with valid actions only (a baseline, and
        a scripted self-play opponent: ``multiagent.league``), from what ``role`` has observed."""
        raise NotImplementedError

    def examples(self, role: str) -> list[tuple[str, str]]:
        """A few (observation, ideal response) pairs of ``role`` from fixed instances, shown as few-shot exchanges."""
        return []

    def render(self) -> str:
        """The whole state as text, every role's hidden part included (``turnrl play``, logs)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release resources. Safe to call more than once."""

    @property
    def unwrapped(self) -> "MultiAgentEnv":
        return self

    def __enter__(self) -> "MultiAgentEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_message(text: str, verb: str = "SAY") -> str | None:
    """The message of a ``"<verb> <message>"`` action in ``text`` (case-insensitive; to the end of its line), or None."""
    found = re.search(rf"\b{re.escape(verb)}\s+(\S[^\n]*)", text, re.IGNORECASE)
    return found.group(1).strip() if found else None


def hot_seat(env: MultiAgentEnv, seed: int | None = None, *, input_fn: Callable[[str], str] = input,
             print_fn: Callable[..., None] = print) -> dict[str, Any]:
    """Play every role of ``env`` yourself, one at a time (``turnrl play`` for a multi-agent env).

    Each acting role's instructions (once) and newest observation are printed, then one line is read as its response;
    ``?`` prints the oracle's response for that role, ``q`` (or end of input) quits. Returns each role's return and
    success, and ``"finished"``: whether every role's episode ended.
    """
    observations, _ = env.reset(seed=seed)
    returns, success, shown = dict.fromkeys(env.roles, 0.0), dict.fromkeys(env.roles, False), set()
    while env.acting():
        actions = {}
        for role in env.acting():
            if role not in shown:
                print_fn(f"[{role}] {env.role_instructions[role]}")
                shown.add(role)
            print_fn(f"[{role}] {observations.get(role, '')}")
            while (text := _read(input_fn, role)) == "?":
                try:
                    print_fn(f"oracle: {env.oracle(role)}")
                except NotImplementedError:
                    print_fn("oracle: none for this env")
            if text is None:
                return {"returns": returns, "success": success, "finished": False}
            actions[role] = text
        out = env.step(actions)
        observations.update(out.observations)
        for role in env.roles:
            returns[role] += out.rewards[role]
            success[role] = out.infos[role]["success"]
        print_fn(f"rewards {out.rewards}")
    print_fn(f"episode over: returns {returns}; success {success}")
    return {"returns": returns, "success": success, "finished": True}


def _read(input_fn: Callable[[str], str], role: str) -> str | None:
    """One line for ``role``; None to quit."""
    try:
        text = input_fn(f"{role}> ").strip()
    except EOFError:
        return None
    return None if text.lower() in ("q", "quit", "exit") else text


# ---------------------------------------------------------------------------------------------- wrappers


class Wrapper(MultiAgentEnv):
    """Forwards everything to the wrapped env; a subclass changes a step's result in :meth:`on_step`."""

    def __init__(self, env: MultiAgentEnv) -> None:
        self.env = env
        self.roles = env.roles  # type: ignore[misc]
        self.role_instructions = env.role_instructions  # type: ignore[misc]

    def on_reset(self) -> None:
        """Called after the wrapped env's reset."""

    def on_step(self, actions: Mapping[str, str], out: MultiStep) -> MultiStep:
        return out

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        out = self.env.reset(seed=seed, options=options)
        self.on_reset()
        return out

    def step(self, actions: Mapping[str, str]) -> MultiStep:
        return self.on_step(actions, self.env.step(actions))

    def acting(self) -> tuple[str, ...]:
        return self.env.acting()

    def anchor(self, role: str) -> str:
        return self.env.anchor(role)

    def task_key(self) -> str:
        return self.env.task_key()

    def oracle(self, role: str) -> str:
        return self.env.oracle(role)

    def rule(self, role: str) -> str:
        return self.env.rule(role)

    def examples(self, role: str) -> list[tuple[str, str]]:
        return self.env.examples(role)

    def render(self) -> str:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    @property
    def unwrapped(self) -> MultiAgentEnv:
        return self.env.unwrapped

    def __getattr__(self, name: str) -> Any:
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


class TurnLimit(Wrapper):
    """Truncate every role that is not yet done on the ``max_turns``-th joint step (``infos[role]["truncation"] = "turns"``).

    A joint step counts once however many roles acted in it; invalid responses count.
    """

    def __init__(self, env: MultiAgentEnv, max_turns: int) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns} must be >= 1")
        super().__init__(env)
        self.max_turns, self.turns = max_turns, 0

    def on_reset(self) -> None:
        self.turns = 0

    def on_step(self, actions: Mapping[str, str], out: MultiStep) -> MultiStep:
        self.turns += 1
        if self.turns >= self.max_turns:
            for role in out.truncated:
                if not (out.terminated[role] or out.truncated[role]):
                    out.truncated[role] = True
                    out.infos[role]["truncation"] = "turns"
        return out


class InvalidPenalty(Wrapper):
    """Pay ``-penalty`` to each acting role whose response held no valid action (reward component ``"invalid_penalty"``)."""

    def __init__(self, env: MultiAgentEnv, penalty: float) -> None:
        if penalty < 0:
            raise ValueError(f"penalty={penalty} must be >= 0 (it is subtracted)")
        super().__init__(env)
        self.penalty = float(penalty)

    def on_step(self, actions: Mapping[str, str], out: MultiStep) -> MultiStep:
        for role in actions:
            if not out.infos[role]["valid"]:
                out.rewards[role] -= self.penalty
                components = dict(out.infos[role]["reward_components"])
                components["invalid_penalty"] = components.get("invalid_penalty", 0.0) - self.penalty
                out.infos[role]["reward_components"] = components
        return out


def wrap(env: MultiAgentEnv, max_turns: int, invalid_penalty: float = 0.0, progress_reward: float = 0.0) -> MultiAgentEnv:
    """``env`` with the standard multi-agent wrappers, as :func:`turnrl.envs.make` applies them."""
    if progress_reward:
        raise ValueError(f"{type(env).__name__} is multi-agent: oracle progress shaping is single-agent only; set env.progress_reward=0")
    if invalid_penalty:
        env = InvalidPenalty(env, invalid_penalty)
    return TurnLimit(env, max_turns)


# ---------------------------------------------------------------------------------------------- checker


def _require(ok: bool, what: str, fix: str) -> None:
    if not ok:
        raise EnvCheckError(f"{what}. Fix: {fix}")


def _check_step(env: MultiAgentEnv, actions: Mapping[str, str], out: Any, where: str) -> MultiStep:
    _require(isinstance(out, MultiStep), f"{where}: step() returned a {type(out).__name__}", "return a MultiStep")
    roles = set(env.roles)
    for name in ("rewards", "terminated", "truncated", "infos"):
        got = set(getattr(out, name))
        _require(got == roles, f"{where}: MultiStep.{name} has roles {sorted(got)}", f"give one entry per role {sorted(roles)}")
    _require(set(out.observations) <= roles and all(isinstance(o, str) for o in out.observations.values()),
             f"{where}: observations {out.observations!r:.80}", "map role names to str observations")
    for role in env.roles:
        info, reward = out.infos[role], out.rewards[role]
        _require(isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward),
                 f"{where}: rewards[{role!r}] = {reward!r}", "give every role a finite float reward")
        _require(isinstance(out.terminated[role], bool) and isinstance(out.truncated[role], bool),
                 f"{where}: terminated/truncated of {role!r} are not bools", "return Python bools")
        _require(isinstance(info.get("success"), bool) and isinstance(info.get("reward_components"), dict),
                 f"{where}: infos[{role!r}] lacks success (bool) or reward_components (dict)", "set both for every role")
        _require(abs(sum(info["reward_components"].values()) - reward) < 1e-6,
                 f"{where}: {role!r}'s reward components do not sum to its reward", "name every part of the reward")
    for role in actions:
        info = out.infos[role]
        _require(isinstance(info.get("valid"), bool) and isinstance(info.get("actions"), list),
                 f"{where}: infos[{role!r}] of an acting role lacks valid (bool) or actions (list)", "set both")
    return out


def _play(env: MultiAgentEnv, seed: int, policy: str, max_steps: int) -> tuple[list[Any], dict[str, bool]]:
    """Play ``seed`` with every acting role sending the oracle's response (``policy="oracle"``), the rule's
    (``"rule"``) or garbage text;
    returns the trace (observations, anchors, each step's result) and each role's last success."""
    observations, _ = env.reset(seed=seed)
    _require(isinstance(observations, dict) and set(observations) == set(env.roles)
             and all(isinstance(o, str) for o in observations.values()),
             f"seed {seed}: reset() observations {observations!r:.80}", "return {role: str observation} for every role")
    trace: list[Any] = [observations, env.task_key()]
    success = {role: False for role in env.roles}
    for step in range(max_steps):
        acting = env.acting()
        if not acting:
            return trace, success
        _require(set(acting) <= set(env.roles), f"seed {seed}: acting() = {acting}", "name roles from env.roles")
        trace.append([env.anchor(role) for role in acting])
        actions = {role: env.oracle(role) if policy == "oracle" else env.rule(role) if policy == "rule" else GARBAGE
                   for role in acting}
        out = _check_step(env, actions, env.step(actions), f"seed {seed}, step {step}")
        _require(policy != "rule" or all(out.infos[r]["valid"] for r in acting),
                 f"seed {seed}, step {step}: rule() sent an invalid action {actions}", "make rule() act validly")
        if policy == "garbage":
            _require(not any(out.infos[r]["valid"] for r in acting), f"seed {seed}: garbage text was a valid action",
                     "answer text without an action with valid=False")
        success = {role: out.infos[role]["success"] for role in env.roles}
        trace.append((out.observations, out.rewards, out.terminated, out.truncated))
    return trace, success


def has_player(env: MultiAgentEnv, player: str, seed: int = 0) -> bool:
    """Whether ``env`` implements ``player`` (``"oracle"`` or ``"rule"``): asked once after ``reset(seed=seed)``."""
    env.reset(seed=seed)
    try:
        getattr(env, player)(env.acting()[0])
    except NotImplementedError:
        return False
    return True


def check_multiagent_env(env: MultiAgentEnv, seeds: Sequence[int] = (0, 1, 2), *, check_solve: bool = True,
                         max_steps: int = 64) -> None:
    """Raise :class:`EnvCheckError` unless ``env`` keeps the contract of this module.

    Roles are distinct and each has instructions; for each seed, playing the oracle team twice gives the same trace
    (observations, anchors, rewards, flags) and task key, ends within ``max_steps`` joint steps, every step has one
    entry per role with finite rewards whose components sum up; with ``check_solve`` some role succeeds (a
    cooperative team; a game's winner). Garbage text is an invalid action that does not raise. An env without an
    oracle is played with garbage text instead (determinism and step shapes only). An env with a ``rule`` plays the
    first seed with a team of rules, every response a valid action. ``close()`` twice.
    """
    roles = tuple(env.roles)
    _require(bool(roles) and len(set(roles)) == len(roles), f"roles = {roles}", "name each role once in env.roles")
    _require(all(env.role_instructions.get(r) for r in roles), "a role has no instructions", "set role_instructions for every role")
    try:
        policy = "oracle" if has_player(env, "oracle", seeds[0]) else "garbage"
        for seed in seeds:
            _check_seed(env, seed, policy, check_solve, max_steps)
        if has_player(env, "rule", seeds[0]):
            _play(env, seeds[0], "rule", max_steps)
        for _ in range(2):
            env.close()
    except EnvCheckError:
        raise
    except Exception as e:  # noqa: BLE001 - reported as a contract failure
        raise EnvCheckError(f"{type(env).__name__} raised {type(e).__name__}: {e}. Fix: never raise on model text (answer "
                            "with feedback and valid=False) and make reset/step/acting/anchor/oracle/close safe") from e


def _check_seed(env: MultiAgentEnv, seed: int, policy: str, check_solve: bool, max_steps: int) -> None:
    first, success = _play(env, seed, policy, max_steps)
    again, _ = _play(env, seed, policy, max_steps)
    _require(first == again, f"seed {seed}: the same seed and actions gave different traces", "seed every draw in reset")
    if policy == "oracle":
        _require(not env.acting(), f"seed {seed}: the oracle team did not finish in {max_steps} joint steps",
                 "end the episode (terminated or truncated) for every role")
        _require(not check_solve or any(success.values()), f"seed {seed}: the oracle team did not succeed",
                 "make oracle() solve the task")
        _play(env, seed, "garbage", 2)
