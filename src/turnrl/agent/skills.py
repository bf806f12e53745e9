"""The skill library: action sequences that recur in successful episodes, offered back to the policy as one
response, ``skill NAME`` (docs/experience.md).

**Extraction** (:meth:`SkillLibrary.learn`, after credit): in every successful episode, the runs of consecutive turns
that executed actions and got a positive advantage are flattened into action sequences; each n-gram of them with
``min_length <= n <= max_length`` counts once per episode. The counts of the last ``max_age`` policy versions are
summed, and the ``max_skills`` most frequent n-grams seen in at least ``min_count`` episodes are the skills (ties: the
longer, then in alphabetical order). A skill is named after its actions (``down-down-right``), so a skill keeps
its name while it stays in the library.

**Use** (:class:`SkillActions`): the skills are listed under every observation; a response ``skill NAME`` runs the
skill's actions on the env, one env step per action (each counts against the env's turn limit), stopping early when
one terminates or truncates the episode. The turn's reward is the steps' rewards summed (so are the reward
components), its ``info["actions"]`` every executed action, ``valid`` whether every step was valid, and its
observation the env's replies in order, each after the action it answered. An unknown name is an invalid turn
answered by the wrapper (reward 0, the env untouched) that lists the skills. The skill list is fixed at ``reset``
for the episode.

What it does to the tokens: only ``skill NAME`` is the policy's response (trained with the turn's advantage); the
list and the replies are observation (prompt). To credit: the expanded steps are one turn, so the estimator sees one
turn with the summed reward, and GiGPO's anchor is the state the skill was called in.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from turnrl.envs.base import Env
from turnrl.envs.wrappers import StepResult, Wrapper
from turnrl.types import Advantages, Termination, Trajectory, TrajectoryGroup

_CALL = re.compile(r"^\s*skill\s+([^\s`'\".,;:]+)", re.IGNORECASE)
MAX_NAME_CHARS = 40  # a longer name keeps its head and a digest of the actions


@dataclass(frozen=True)
class Skill:
    """A named action sequence and the number of successful episodes (within ``max_age`` versions) it came from."""

    name: str
    actions: tuple[str, ...]
    count: int

    def describe(self) -> str:
        return f"{self.name} = {', '.join(self.actions)}"


def skill_name(actions: tuple[str, ...], digest: bool = False) -> str:
    """``down-down-right`` from ``("Down", "Down", "Right")``: each action's lower-cased words joined by ``_``,
    the actions by ``-``; past :data:`MAX_NAME_CHARS` (or with ``digest``) the head plus 8 hex digits of the
    actions' SHA-1."""
    name = "-".join("_".join(re.findall(r"\w+", a.lower())) or "x" for a in actions)
    if len(name) <= MAX_NAME_CHARS and not digest:
        return name
    return name[: MAX_NAME_CHARS - 9] + "-" + hashlib.sha1("\x00".join(actions).encode()).hexdigest()[:8]


def positive_runs(traj: Trajectory, advantages: list[float]) -> list[list[str]]:
    """The action sequences of ``traj``'s maximal runs of consecutive turns that executed actions with advantage > 0."""
    runs: list[list[str]] = [[]]
    for turn, adv in zip(traj.turns, advantages):
        if turn.actions and adv > 0:
            runs[-1] += turn.actions
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def ngrams(runs: list[list[str]], min_length: int, max_length: int) -> set[tuple[str, ...]]:
    """Every distinct n-gram (``min_length <= n <= max_length``) inside one of ``runs``."""
    return {tuple(run[i: i + n]) for run in runs for n in range(min_length, max_length + 1)
            for i in range(len(run) - n + 1)}


class SkillLibrary:
    """Skills extracted from the successful episodes of the last ``max_age`` policy versions (module docstring)."""

    def __init__(self, max_skills: int = 4, min_length: int = 2, max_length: int = 4, min_count: int = 2,
                 max_age: int = 4) -> None:
        if not 2 <= min_length <= max_length or max_skills < 1 or min_count < 1 or max_age < 1:
            raise ValueError(f"need 2 <= min_length ({min_length}) <= max_length ({max_length}) and max_skills "
                             f"({max_skills}), min_count ({min_count}), max_age ({max_age}) >= 1")
        self.max_skills, self.min_length, self.max_length, self.min_count, self.max_age = (
            max_skills, min_length, max_length, min_count, max_age)
        self._counts: dict[int, Counter[tuple[str, ...]]] = {}  # policy version -> n-gram -> episodes
        self.skills: list[Skill] = []

    def get(self, name: str) -> Skill | None:
        return next((s for s in self.skills if s.name == name.lower()), None)

    def add(self, trajectories: list[Trajectory], advantages: Advantages, version: int) -> None:
        """Count the n-grams of the successful ``trajectories`` (credited by ``advantages``), forget counts older
        than ``max_age`` versions before ``version``, and re-pick the skills."""
        for i, traj in enumerate(trajectories):
            if traj.success and traj.termination != Termination.ENV_ERROR:
                grams = ngrams(positive_runs(traj, advantages.turns[i]), self.min_length, self.max_length)
                self._counts.setdefault(traj.policy_version, Counter()).update(grams)
        self._counts = {v: c for v, c in self._counts.items() if v >= version - self.max_age}
        self._pick()

    def _pick(self) -> None:
        total: Counter[tuple[str, ...]] = sum(self._counts.values(), Counter())
        ranked = sorted((g for g, n in total.items() if n >= self.min_count), key=lambda g: (-total[g], -len(g), g))
        skills: list[Skill] = []
        for actions in ranked[: self.max_skills]:
            name = skill_name(actions)
            if any(s.name == name for s in skills):  # two action sequences with one slug: the digest tells them apart
                name = skill_name(actions, digest=True)
            skills.append(Skill(name, actions, total[actions]))
        self.skills = skills  # one assignment: an episode reset in another thread (scale.async_mode) reads either list

    def learn(self, groups: list[TrajectoryGroup], advantages: Advantages, version: int) -> dict[str, float]:
        """Update from the credited batch (``version``: the policy's after this step's update); returns the metrics
        of the batch's skill use and the library's size."""
        trajectories = [t for g in groups for t in g.trajectories]
        metrics = usage_metrics(trajectories)
        self.add(trajectories, advantages, version)
        metrics["skills/count"] = float(len(self.skills))
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"counts": {v: [[list(g), n] for g, n in c.items()] for v, c in self._counts.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._counts = {int(v): Counter({tuple(g): n for g, n in rows}) for v, rows in state["counts"].items()}
        self._pick()


def usage_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """``skills/used_frac``: the fraction of turns that ran a known skill; ``skills/success_when_used``: the success
    rate of episodes with such a turn (absent when none had one)."""
    turns = [t for traj in trajectories for t in traj.turns]
    if not turns:
        return {}
    used = [traj for traj in trajectories if any(_ran_skill(t.info) for t in traj.turns)]
    metrics = {"skills/used_frac": sum(_ran_skill(t.info) for t in turns) / len(turns)}
    if used:
        metrics["skills/success_when_used"] = sum(t.success for t in used) / len(used)
    return metrics


def _ran_skill(info: dict[str, Any]) -> bool:
    return info.get("skill", {}).get("known", False)


class SkillActions(Wrapper):
    """Answer ``skill NAME`` by running the skill's actions on ``env`` (module docstring); list the ``library``'s
    skills under every observation. Any other response goes to the env unchanged.

    A call of an unknown skill is answered here (it steps nothing, so the env's turn limit does not see it) at most
    ``max_unknown`` times per episode; later ones go to the env like any response, so an episode stays bounded by
    the env's turn limit plus ``max_unknown`` responses.

    ``env_observation`` is the env's latest reply without the skill list (what an outer
    :class:`~turnrl.agent.experience.ExperienceRetrieval` keys records by under ``key="observation"``).
    """

    def __init__(self, env: Env, library: SkillLibrary, max_unknown: int = 2) -> None:
        super().__init__(env)
        self.library, self.max_unknown = library, max_unknown
        self._skills: dict[str, Skill] = {}
        self.env_observation, self._success, self._unknown_calls = "", False, 0

    @property
    def instructions(self) -> str:  # type: ignore[override]
        return (f"{self.env.instructions} When skills are listed, you may instead answer `skill NAME` to run that "
                "skill's actions in order.")

    def on_reset(self, observation: str, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._skills = {s.name: s for s in self.library.skills}
        self.env_observation, self._success, self._unknown_calls = observation, False, 0
        return self._listed(observation), info

    def on_step(self, observation: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> StepResult:
        self.env_observation, self._success = observation, bool(info.get("success", False))
        return self._listed(observation), reward, terminated, truncated, info

    def step(self, action_text: str) -> StepResult:
        skill = self._called(action_text)
        if not isinstance(skill, Skill):
            return self._unknown(skill) if skill else super().step(action_text)
        replies = []
        for action in skill.actions:
            result = self.env.step(action)
            replies.append((action, result))
            if result[2] or result[3]:  # terminated or truncated: the rest of the skill does not run
                break
        return self._ran(skill, replies)

    async def astep(self, action_text: str) -> StepResult:
        skill = self._called(action_text)
        if not isinstance(skill, Skill):
            return self._unknown(skill) if skill else await super().astep(action_text)
        replies = []
        for action in skill.actions:
            result = await self.env.astep(action)
            replies.append((action, result))
            if result[2] or result[3]:  # terminated or truncated: the rest of the skill does not run
                break
        return self._ran(skill, replies)

    def _ran(self, skill: Skill, replies: list[tuple[str, StepResult]]) -> StepResult:
        result = self.on_step(*merge(skill, replies))
        self.env_observation = replies[-1][1][0]  # the state now: the last reply, not the whole run
        return result

    def _called(self, text: str) -> Skill | str | None:
        """The skill ``text`` calls; its name when no such skill is offered (while unknown calls are answered here);
        None when ``text`` calls none, or is left to the env."""
        match = _CALL.match(text)
        if match is None:
            return None
        name = match.group(1).lower()
        if name in self._skills:
            return self._skills[name]
        return name if self._unknown_calls < self.max_unknown else None

    def _unknown(self, name: str) -> StepResult:
        self._unknown_calls += 1
        offered = ", ".join(self._skills) or "none yet"
        info = {"actions": [], "valid": False, "success": self._success, "reward_components": {},
                "skill": {"name": name, "known": False}}
        feedback = f"There is no skill '{name}' (skills: {offered})."
        return f"{feedback}\n{self._listed(self.env_observation)}", 0.0, False, False, info

    def _listed(self, observation: str) -> str:
        if not self._skills:
            return observation
        return f"{observation}\nSkills (answer `skill NAME`): " + "; ".join(s.describe() for s in self._skills.values())


def merge(skill: Skill, replies: list[tuple[str, StepResult]]) -> StepResult:
    """One turn from the env's replies to a skill's actions: rewards and components summed, the last reply's end."""
    reward, executed, valid, components = 0.0, [], True, {}
    for _, (_, step_reward, _, _, step_info) in replies:
        reward += step_reward
        executed += step_info.get("actions", [])
        valid = valid and bool(step_info.get("valid", True))
        for name, value in step_info.get("reward_components", {"reward": step_reward}).items():
            components[name] = components.get(name, 0.0) + value
    _, (_, _, terminated, truncated, last_info) = replies[-1]
    observation = "\n".join(f"> {action}\n{obs}" for action, (obs, *_) in replies)
    ran = [action for action, _ in replies]
    info = {**last_info, "actions": executed, "valid": valid, "reward_components": components,
            "skill": {"name": skill.name, "known": True, "ran": ran, "completed": len(ran) == len(skill.actions)}}
    return observation, reward, terminated, truncated, info
