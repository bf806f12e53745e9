"""Cross-cutting behaviour as wrappers, not flags: turn limits, penalties, shaping, episode statistics.

A wrapper changes what the env returns through two hooks, :meth:`Wrapper.on_reset` and
:meth:`Wrapper.on_step`, which both the sync (``reset``/``step``) and async (``areset``/``astep``) paths
run, so a wrapper keeps the inner env's real coroutines and behaves the same either way.

Every wrapper that changes the reward adds its own named entry to ``info["reward_components"]``, so the
components always sum to the reward and each is logged separately.
"""

from __future__ import annotations

from typing import Any

from turnrl.envs.base import Env

StepResult = tuple[str, float, bool, bool, dict[str, Any]]


class Wrapper(Env):
    """Forwards everything to the wrapped ``env``; subclasses override the hooks (or methods) they change.

    Attributes a wrapper does not define are looked up on the wrapped env, so ``wrapped.desc`` reaches
    the innermost env's ``desc``. ``unwrapped`` is the innermost env.
    """

    def __init__(self, env: Env) -> None:
        self.env = env

    @property
    def instructions(self) -> str:  # type: ignore[override]
        return self.env.instructions

    @property
    def max_actions_per_turn(self) -> int:  # type: ignore[override]
        return self.env.max_actions_per_turn

    def on_reset(self, observation: str, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Called with what the wrapped env's ``reset``/``areset`` returned; returns what this wrapper returns."""
        return observation, info

    def on_step(self, observation: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> StepResult:
        """Called with what the wrapped env's ``step``/``astep`` returned; returns what this wrapper returns."""
        return observation, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return self.on_reset(*self.env.reset(seed=seed, options=options))

    def step(self, action_text: str) -> StepResult:
        return self.on_step(*self.env.step(action_text))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        return self.on_reset(*await self.env.areset(seed=seed, options=options))

    async def astep(self, action_text: str) -> StepResult:
        return self.on_step(*await self.env.astep(action_text))

    def anchor(self) -> str:
        return self.env.anchor()

    def situation(self) -> str:
        return self.env.situation()

    def task_key(self) -> str:
        return self.env.task_key()

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
        if name == "env":  # not set yet (e.g. while unpickling): do not recurse
            raise AttributeError(name)
        return getattr(self.env, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.env!r})"


def add_reward_component(info: dict[str, Any], name: str, value: float) -> None:
    """Add ``value`` to ``info["reward_components"][name]`` (a copy, so the inner env's dict is not mutated)."""
    components = dict(info.get("reward_components", {}))
    components[name] = components.get(name, 0.0) + value
    info["reward_components"] = components


class TurnLimit(Wrapper):
    """Truncate the episode on its ``max_turns``-th turn unless that turn terminated it.

    Sets ``truncated=True`` and ``info["truncation"] = "turns"``; never touches ``terminated``. Invalid
    turns count: a turn is one response, whatever it held.
    """

    def __init__(self, env: Env, max_turns: int) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns} must be >= 1")
        super().__init__(env)
        self.max_turns = max_turns
        self.turns = 0

    def on_reset(self, observation: str, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.turns = 0
        return observation, info

    def on_step(self, observation: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> StepResult:
        self.turns += 1
        if self.turns >= self.max_turns and not terminated and not truncated:
            truncated = True
            info["truncation"] = "turns"
        return observation, reward, terminated, truncated, info


class InvalidActionPenalty(Wrapper):
    """Pay ``-penalty`` on a turn whose text held no valid action (``info["valid"]`` False).

    The penalty is the reward component ``"invalid_penalty"``; ``penalty`` must be >= 0.
    """

    def __init__(self, env: Env, penalty: float) -> None:
        if penalty < 0:
            raise ValueError(f"penalty={penalty} must be >= 0 (it is subtracted)")
        super().__init__(env)
        self.penalty = float(penalty)

    def on_step(self, observation: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> StepResult:
        if not info["valid"]:
            reward -= self.penalty
            add_reward_component(info, "invalid_penalty", -self.penalty)
        return observation, reward, terminated, truncated, info


class SuccessReward(Wrapper):
    """The binary verifiable reward: 1.0 on the turn whose ``info["success"]`` is True, else 0.0.

    It replaces the env's own reward (WebShop's partial credit for a near-miss purchase, a sandbox's share of tests
    passed), so a policy cannot collect reward without solving the task. The env's components become the one
    component ``"success"``; what the env would have paid stays readable as ``info["env_reward"]``. Applied innermost,
    so ``progress_reward`` and ``invalid_penalty`` shaping still add their own components on top.
    """

    def on_step(self, observation: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> StepResult:
        info["env_reward"] = reward
        reward = 1.0 if info["success"] else 0.0
        info["reward_components"] = {"success": reward}
        return observation, reward, terminated, truncated, info


class OracleProgress(Wrapper):
    """Dense shaping from the env's oracle: ``weight * (d_before - d_after)`` per turn (component ``"progress"``).

    ``d`` is the length of ``env.solve()``, the oracle's shortest remaining plan. Reaching the goal gives
    ``d_after = 0``; a move into a state with no plan left (a hole, a deadlock) counts as one step away
    from the goal (``d_after = d_before + 1``) rather than the undefined distance. Except for that case this
    is potential-based shaping with potential ``-weight * d`` and gamma = 1 (Ng et al. 1999), so it does not
    change which policies are optimal. Invalid turns get no progress component. It is a training aid:
    evaluation reads ``success``, never this.
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

    def on_reset(self, observation: str, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._distance = self._plan_length()
        return observation, info

    def on_step(self, observation: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> StepResult:
        before = self._distance
        after = 0 if info["success"] else self._plan_length()
        if before is not None and info["valid"]:
            shaped = self.weight * ((before - after) if after is not None else -1)
            reward += shaped
            add_reward_component(info, "progress", shaped)
        self._distance = after
        return observation, reward, terminated, truncated, info


class EpisodeStatistics(Wrapper):
    """On the episode's last step (terminated or truncated) set ``info["episode"]``.

    ``info["episode"] = {"return": float, "length": int (turns), "invalid": int (turns with valid=False),
    "success": bool (the last step's info["success"])}``.
    """

    def __init__(self, env: Env) -> None:
        super().__init__(env)
        self._return, self._length, self._invalid = 0.0, 0, 0

    def on_reset(self, observation: str, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._return, self._length, self._invalid = 0.0, 0, 0
        return observation, info

    def on_step(self, observation: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> StepResult:
        self._return += reward
        self._length += 1
        self._invalid += not info["valid"]
        if terminated or truncated:
            info["episode"] = {
                "return": self._return, "length": self._length, "invalid": self._invalid, "success": info["success"],
            }
        return observation, reward, terminated, truncated, info
