"""Cross-cutting behaviour as wrappers, not flags: turn limits, penalties, shaping, statistics.

Every wrapper that changes the reward adds its own named entry to ``info["reward_components"]`` so the
components always sum to the reward and each is logged separately.
"""

from __future__ import annotations

from typing import Any

from turnrl.envs.base import Env


class Wrapper(Env):
    """Forwards everything to the wrapped env; subclasses override what they change."""

    def __init__(self, env: Env) -> None:
        self.env = env

    @property
    def instructions(self) -> str:  # type: ignore[override]
        return self.env.instructions

    @property
    def max_actions_per_turn(self) -> int:  # type: ignore[override]
        return self.env.max_actions_per_turn

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return self.env.reset(seed=seed, options=options)

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self.env.step(action_text)

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return self.reset(seed=seed, options=options)

    async def astep(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return self.step(action_text)

    def anchor(self) -> str:
        return self.env.anchor()

    def solve(self) -> list[str] | None:
        return self.env.solve()

    def examples(self) -> list[tuple[str, str]]:
        return self.env.examples()

    def render(self) -> str:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    @property
    def unwrapped(self) -> Env:
        return self.env.unwrapped

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # not yet set (during unpickling): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self.env, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env!r})"


def _add_component(info: dict[str, Any], name: str, value: float) -> None:
    comps = dict(info.get("reward_components", {}))
    comps[name] = comps.get(name, 0.0) + value
    info["reward_components"] = comps


class TurnLimit(Wrapper):
    """Truncate after ``max_turns`` turns. Sets ``info["truncation"] = "turns"``; never marks termination."""

    def __init__(self, env: Env, max_turns: int) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns} must be >= 1")
        super().__init__(env)
        self.max_turns = max_turns
        self.turns = 0

    def reset(self, *, seed=None, options=None):
        self.turns = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action_text):
        obs, reward, terminated, truncated, info = self.env.step(action_text)
        self.turns += 1
        if self.turns >= self.max_turns and not terminated:
            truncated = True
            info.setdefault("truncation", "turns")
        return obs, reward, terminated, truncated, info


class InvalidActionPenalty(Wrapper):
    """Subtract ``penalty`` on a turn whose text held no valid action (component ``invalid_penalty``)."""

    def __init__(self, env: Env, penalty: float) -> None:
        super().__init__(env)
        self.penalty = float(penalty)

    def step(self, action_text):
        obs, reward, terminated, truncated, info = self.env.step(action_text)
        if not info.get("valid", True) and self.penalty:
            reward -= self.penalty
            _add_component(info, "invalid_penalty", -self.penalty)
        return obs, reward, terminated, truncated, info


class OracleProgress(Wrapper):
    """Dense shaping from the env's oracle: ``weight * (d_before - d_after)`` per turn (component ``progress``).

    ``d`` is the length of ``env.solve()``, the oracle's shortest remaining plan. Reaching the goal gives
    ``d_after = 0``; a move into a state with no plan left (a hole, a deadlock) counts as one step away
    from the goal (``d_after = d_before + 1``) rather than the undefined distance. Except for that case this
    is potential-based shaping with potential ``-weight * d`` and gamma = 1 (Ng et al. 1999), so it does not
    change which policies are optimal. It is a training aid: evaluation reads ``success``, never this.
    """

    def __init__(self, env: Env, weight: float) -> None:
        super().__init__(env)
        self.weight = float(weight)
        self._distance: int | None = None

    def _plan_length(self) -> int | None:
        try:
            plan = self.env.solve()
        except NotImplementedError:
            raise TypeError(
                f"{type(self.env.unwrapped).__name__} has no oracle (solve() is not implemented), so progress shaping "
                "cannot be computed; set env.progress_reward=0"
            ) from None
        return None if plan is None else len(plan)

    def reset(self, *, seed=None, options=None):
        out = self.env.reset(seed=seed, options=options)
        self._distance = self._plan_length()
        return out

    def step(self, action_text):
        obs, reward, terminated, truncated, info = self.env.step(action_text)
        before = self._distance
        after = 0 if info.get("success") else self._plan_length()
        if before is not None and info.get("valid", True):
            delta = (before - after) if after is not None else -1
            shaped = self.weight * delta
            reward += shaped
            _add_component(info, "progress", shaped)
        self._distance = after
        return obs, reward, terminated, truncated, info


class EpisodeStatistics(Wrapper):
    """On the final step, put ``{"return", "length", "invalid", "success"}`` in ``info["episode"]``."""

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self._ret = 0.0
        self._len = 0
        self._invalid = 0

    def reset(self, *, seed=None, options=None):
        self._ret, self._len, self._invalid = 0.0, 0, 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action_text):
        obs, reward, terminated, truncated, info = self.env.step(action_text)
        self._ret += reward
        self._len += 1
        self._invalid += not info.get("valid", True)
        if terminated or truncated:
            info["episode"] = {"return": self._ret, "length": self._len, "invalid": self._invalid, "success": bool(info.get("success"))}
        return obs, reward, terminated, truncated, info
