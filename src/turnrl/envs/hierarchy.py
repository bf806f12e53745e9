"""Hierarchy as a multi-agent env: a planner role sets subgoals, an executor role acts on them (``docs/hierarchy.md``).

:class:`Hierarchy` turns a single-agent :class:`~turnrl.envs.base.Env` plus a :class:`Subgoals` verifier into a
two-role :class:`~turnrl.envs.multiagent.MultiAgentEnv`, so the multi-agent collector plays both roles with one
shared model (role prompts) and records each role's turns as its own exact token-in, token-out trajectory.

Turn-taking: the ``planner`` acts first and whenever no subgoal is open; it answers with a subgoal in the verifier's
format (``GOAL <row> <col>`` for FrozenLake). The ``executor`` then acts on the task (the wrapped env's actions),
seeing the env's observation plus its subgoal, until a **segment** ends: the subgoal is reached, ``every`` valid
executor turns have passed, or the episode ends. Then the planner speaks again, told whether the segment reached
its subgoal. An invalid response of either role changes nothing (feedback, the same role acts again, as the
contract requires); an invalid executor turn does not count towards ``every``.

Rewards (``infos[role]["reward_components"]``, logged as ``rollout/reward/<name>``):

- the wrapped env's own reward and components (``outcome``, ...) go to **both** roles, on the executor's turn that
  earned them (the planner's share lands on its latest turn): the task is the team's;
- ``milestone`` (executor only): ``milestone_reward`` on the turn that reaches the open subgoal, as the verifier
  checks it on the env's state (:meth:`Subgoals.reached`);
- ``hindsight`` (executor only), the hindsight segment reward: a segment that ends *without* reaching its subgoal is
  relabelled with the subgoal it did achieve, ``g' = Subgoals.label()`` of its end state; when ``g'`` is valid, i.e.
  the segment made progress on the task (``progress(end) > progress(start)``, :meth:`Subgoals.progress`), the
  segment's last turn gets ``hindsight_reward``. So a segment pays ``milestone_reward`` for its own subgoal,
  ``hindsight_reward`` for another valid one, 0 otherwise (formula in ``docs/hierarchy.md``).

Both roles end together when the wrapped env terminates or truncates (its ``success`` is both roles'). ``anchor``:
the planner's is the wrapped env's anchor; the executor's adds its open subgoal. ``task_key`` is the wrapped env's,
so a hierarchy and the flat env hold out the same tasks for the same seeds. ``oracle``: the verifier's plan
(:meth:`Subgoals.propose`, :meth:`Subgoals.toward`).

Built in: ``frozenlake-hier-v0`` (:class:`FrozenLakeHierarchy`): a random 8x8 FrozenLake map per seed, subgoals are
cells (``GOAL <row> <col>``); its flat counterpart is ``frozenlake-8x8-v0``. ``sokoban-hier-v0``
(:class:`SokobanHierarchy`): a 6x6 Sokoban room with two boxes per seed, subgoals are targets to fill
(``BOX <row> <col>``, "box on target").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from turnrl.envs.base import Env
from turnrl.envs.frozenlake import ACTIONS, EXAMPLES, FrozenLake, move, shortest_path
from turnrl.envs.multiagent import MultiAgentEnv, MultiStep
from turnrl.envs.registry import make
from turnrl.envs.search import shortest_plan
from turnrl.envs.sokoban import ACTIONS as SOKOBAN_ACTIONS, Puzzle, Sokoban, solve

PLANNER, EXECUTOR = "planner", "executor"


class Subgoals:
    """A subgoal verifier: subgoals of one env named as text and checked on the env's current state.

    Bound to the env it reads (the unwrapped one: its state, not its text). A subgoal is a canonical string
    (:meth:`parse` makes it from the planner's text).
    """

    format: str = ""  # how the planner writes a subgoal, quoted in its instructions
    env: Env  # the unwrapped env whose state it reads

    def parse(self, text: str) -> tuple[str | None, str]:
        """``(subgoal, "")`` for a valid subgoal in ``text``; ``(None, why)`` otherwise (the planner's feedback)."""
        raise NotImplementedError

    def reached(self, subgoal: str) -> bool:
        """Whether the env's current state satisfies ``subgoal``."""
        raise NotImplementedError

    def label(self) -> str:
        """The subgoal the current state satisfies (the hindsight relabel of a segment ending here)."""
        raise NotImplementedError

    def progress(self) -> float:
        """How far the task is along (higher is closer to success); a hindsight label counts only if this grew."""
        raise NotImplementedError

    def where(self) -> str:
        """A line locating the agent and the task's goal, for the planner."""
        raise NotImplementedError

    def describe(self, subgoal: str) -> str:
        """``subgoal`` as the executor reads it."""
        raise NotImplementedError

    def propose(self, horizon: int) -> str:
        """The oracle planner's response: a subgoal about ``horizon`` executor turns along a shortest solution, or the
        next of the task's natural milestones where it has them."""
        raise NotImplementedError

    def toward(self, subgoal: str) -> str:
        """The oracle executor's response: the first action of a shortest way to ``subgoal``."""
        raise NotImplementedError

    def examples(self) -> list["Subgoals"]:
        """Verifiers bound to fixed example states (not training or evaluation tasks), for few-shot exchanges."""
        return []


class Hierarchy(MultiAgentEnv):
    """``env`` played by a planner and an executor (module docstring).

    Args:
        env: the single-agent env (with its own turn limit: its truncation ends the hierarchy's episode).
        subgoals: the verifier, bound to ``env.unwrapped``.
        every: valid executor turns after which a segment ends even if its subgoal is not reached.
        milestone_reward: the executor's reward for reaching its subgoal (component ``milestone``).
        hindsight_reward: the executor's reward for a segment that missed its subgoal but made progress
            (component ``hindsight``).
    """

    roles = (PLANNER, EXECUTOR)

    def __init__(self, env: Env, subgoals: Subgoals, every: int = 4, milestone_reward: float = 0.5,
                 hindsight_reward: float = 0.25) -> None:
        if every < 1:
            raise ValueError(f"every={every} must be >= 1 (executor turns per segment)")
        if milestone_reward < 0 or hindsight_reward < 0:
            raise ValueError(f"milestone_reward={milestone_reward} and hindsight_reward={hindsight_reward} must be >= 0")
        self.env, self.subgoals, self.every = env, subgoals, every
        self.milestone_reward, self.hindsight_reward = float(milestone_reward), float(hindsight_reward)
        self.role_instructions = {  # type: ignore[misc]
            PLANNER: f"You are the planner of a two-player team. Your teammate, the executor, plays this task: "
                     f"{env.instructions} You do not move: you give the executor subgoals on the way to the task's goal. "
                     f"Answer only with one subgoal: {subgoals.format}",
            EXECUTOR: f"You are the executor of a two-player team: reach the subgoal your planner set. {env.instructions}",
        }
        self.subgoal: str | None = None
        self.observation, self.report = "", ""
        self.segment_turns, self.start_progress, self.done = 0, 0.0, False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        self.observation, info = self.env.reset(seed=seed, options=options)
        self.subgoal, self.report, self.segment_turns, self.done = None, "", 0, False
        return {PLANNER: self._to_planner(), EXECUTOR: self.observation}, info

    def acting(self) -> tuple[str, ...]:
        if self.done:
            return ()
        return (PLANNER,) if self.subgoal is None else (EXECUTOR,)

    def step(self, actions: Mapping[str, str]) -> MultiStep:
        if set(actions) != set(self.acting()):
            raise ValueError(f"step() got actions of {sorted(actions)}; acting now: {list(self.acting())}")
        if PLANNER in actions:
            return self._plan(actions[PLANNER])
        return self._execute(actions[EXECUTOR])

    def _plan(self, text: str) -> MultiStep:
        subgoal, why = self.subgoals.parse(text)
        out = self._result({}, {}, done=(False, False))
        if subgoal is None:
            out.observations[PLANNER] = f"{why}\n{self._to_planner()}"
            out.infos[PLANNER] |= {"valid": False, "actions": []}
            return out
        self.subgoal, self.segment_turns, self.start_progress = subgoal, 0, self.subgoals.progress()
        out.observations[EXECUTOR] = self._to_executor()
        out.infos[PLANNER] |= {"valid": True, "actions": [f"GOAL {subgoal}"]}
        return out

    def _execute(self, text: str) -> MultiStep:
        assert self.subgoal is not None
        self.observation, _, terminated, truncated, info = self.env.step(text)
        shared = dict(info.get("reward_components", {}))
        mine = dict(shared)
        valid = bool(info.get("valid", True))
        self.segment_turns += valid
        reached = valid and self.subgoals.reached(self.subgoal)
        ended = reached or self.segment_turns >= self.every or terminated or truncated
        if reached:
            mine["milestone"] = self.milestone_reward
            self.report = f"The executor reached subgoal {self.subgoal}."
        elif ended:
            mine.update(self._hindsight())
        out = self._result(shared, mine, done=(terminated, truncated), success=bool(info.get("success", False)))
        out.infos[EXECUTOR] |= {"valid": valid, "actions": list(info.get("actions", [])), "subgoal": self.subgoal}
        if truncated:
            for role in self.roles:
                out.infos[role]["truncation"] = info.get("truncation", "turns")
        if ended:
            self.subgoal = None
        self.done = terminated or truncated
        if self.done:
            out.observations = {PLANNER: self.observation, EXECUTOR: self.observation}
        else:
            out.observations = {PLANNER: self._to_planner()} if ended else {EXECUTOR: self._to_executor()}
        return out

    def _hindsight(self) -> dict[str, float]:
        """A missed segment relabelled with the subgoal it achieved: paid when that one made progress."""
        achieved = self.subgoals.label()
        if self.subgoals.progress() > self.start_progress:
            self.report = f"The executor missed subgoal {self.subgoal} but got to {achieved}."
            return {"hindsight": self.hindsight_reward}
        self.report = f"The executor missed subgoal {self.subgoal} and got no closer to the goal."
        return {}

    def _result(self, shared: dict[str, float], mine: dict[str, float], done: tuple[bool, bool],
                success: bool = False) -> MultiStep:
        """A step's result: ``shared`` components to the planner, ``mine`` to the executor, both ended by ``done``."""
        components = {PLANNER: dict(shared), EXECUTOR: dict(mine)}
        return MultiStep(
            observations={},
            rewards={role: float(sum(c.values())) for role, c in components.items()},
            terminated=dict.fromkeys(self.roles, done[0]),
            truncated=dict.fromkeys(self.roles, done[1]),
            infos={role: {"success": success, "reward_components": components[role]} for role in self.roles},
        )

    def _to_planner(self) -> str:
        return planner_view(self.subgoals, self.observation, self.report)

    def _to_executor(self) -> str:
        return executor_view(self.subgoals, self.observation, self.subgoal or "")

    def anchor(self, role: str) -> str:
        inner = self.env.anchor()
        return inner if role == PLANNER else f"{inner}|subgoal {self.subgoal}"

    def task_key(self) -> str:
        return self.env.task_key()

    def oracle(self, role: str) -> str:
        if role == PLANNER:
            return self.subgoals.propose(self.every)
        return self.subgoals.toward(self.subgoal or "")

    def examples(self, role: str) -> list[tuple[str, str]]:
        """Each example state of the verifier, rendered as this role sees it, with the oracle's response."""
        out = []
        for s in self.subgoals.examples():
            observation = s.env.render()
            if role == PLANNER:
                out.append((planner_view(s, observation, ""), s.propose(self.every)))
            else:
                subgoal = s.parse(s.propose(self.every))[0] or ""
                out.append((executor_view(s, observation, subgoal), s.toward(subgoal)))
        return out

    def render(self) -> str:
        return f"{self.env.render()}\nsubgoal: {self.subgoal}"

    def close(self) -> None:
        self.env.close()


def planner_view(subgoals: Subgoals, observation: str, report: str) -> str:
    """The planner's observation: the env's, where things are, how the last segment went, the subgoal format."""
    lines = [observation, subgoals.where(), *([report] if report else []), f"Set the next subgoal: {subgoals.format}"]
    return "\n".join(lines)


def executor_view(subgoals: Subgoals, observation: str, subgoal: str) -> str:
    """The executor's observation: the env's, and its open subgoal."""
    return f"{observation}\nSubgoal: {subgoals.describe(subgoal)}"


# ---------------------------------------------------------------------------------------------- FrozenLake

Cell = tuple[int, int]


class CellSubgoals(Subgoals):
    """Subgoals named by a cell, written ``"<verb> <row> <col>"``; canonical form ``"<row> <col>"``."""

    verb: str = ""  # the word before the cell in the planner's answer

    def __init__(self, env: Env) -> None:
        self.env = env

    def parse(self, text: str) -> tuple[str | None, str]:
        cell = _parse_cell(self.verb, text)
        if cell is None:
            return None, f"No subgoal found. Write: {self.format}"
        why = self.invalid(cell)
        return (None, why) if why else (f"{cell[0]} {cell[1]}", "")

    def invalid(self, cell: Cell) -> str:
        """Why ``cell`` is not a valid subgoal in the current state ("" when it is)."""
        raise NotImplementedError


def _parse_cell(verb: str, text: str) -> Cell | None:
    """The cell of a ``"<verb> <row> <col>"`` subgoal in ``text`` (case-insensitive), or None."""
    found = re.search(rf"\b{verb}\W*(\d+)\W+(\d+)", text, re.IGNORECASE)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _cell_of(subgoal: str) -> Cell:
    """The cell of a canonical subgoal ``"<row> <col>"``."""
    r, c = subgoal.split()
    return int(r), int(c)


def _offset(start: Cell, cell: Cell) -> str:
    """``"2 down, 1 right"``: rows then columns from ``start`` to ``cell``; ``"here"`` when they are the same."""
    dr, dc = cell[0] - start[0], cell[1] - start[1]
    parts = []
    if dr:
        parts.append(f"{abs(dr)} {'down' if dr > 0 else 'up'}")
    if dc:
        parts.append(f"{abs(dc)} {'right' if dc > 0 else 'left'}")
    return ", ".join(parts) or "here"


class FrozenLakeSubgoals(CellSubgoals):
    """FrozenLake's subgoals: cells to stand on, ``"<row> <col>"`` (0-based from the top left).

    Valid: a cell on the map, not a hole, not the player's own, reachable without crossing a hole. Progress: minus
    the shortest path's length from the player to the goal (a hole, from which none exists: minus infinity).
    """

    verb = "GOAL"
    format = "GOAL <row> <col>"
    env: FrozenLake

    def invalid(self, cell: Cell) -> str:
        rows, cols = len(self.env.desc), len(self.env.desc[0])
        if not (cell[0] < rows and cell[1] < cols):
            return f"Cell {cell[0]} {cell[1]} is off the map: rows 0-{rows - 1}, columns 0-{cols - 1}."
        if cell == self.env.pos:
            return f"P already stands on {cell[0]} {cell[1]}: choose another cell."
        if self._path(cell) is None:
            return f"Cell {cell[0]} {cell[1]} is a hole or cannot be reached: choose another cell."
        return ""

    def reached(self, subgoal: str) -> bool:
        return self.label() == subgoal

    def label(self) -> str:
        return f"{self.env.pos[0]} {self.env.pos[1]}"

    def progress(self) -> float:
        path = shortest_path(self.env.desc, self.env.pos)
        return float("-inf") if path is None else -float(len(path))

    def where(self) -> str:
        goal = next((r, c) for r, row in enumerate(self.env.desc) for c, ch in enumerate(row) if ch == "G")
        return (f"P is at row {self.env.pos[0]}, column {self.env.pos[1]}; G is at row {goal[0]}, column {goal[1]} "
                "(rows and columns count from 0 at the top left).")

    def describe(self, subgoal: str) -> str:
        r, c = _cell_of(subgoal)
        return f"reach row {r}, column {c} ({_offset(self.env.pos, (r, c))})"

    def propose(self, horizon: int) -> str:
        pos, path = self.env.pos, shortest_path(self.env.desc, self.env.pos) or []
        for action in path[:horizon]:
            pos = move(self.env.desc, pos, action)
        return f"GOAL {pos[0]} {pos[1]}"

    def toward(self, subgoal: str) -> str:
        path = self._path(_cell_of(subgoal)) if subgoal else None
        return path[0] if path else ""

    def _path(self, cell: Cell) -> list[str] | None:
        """A shortest hole-free path from the player to ``cell`` (ties: Left, Down, Right, Up), or None."""
        desc = self.env.desc

        def successors(pos: Cell):
            for action in ACTIONS:
                nxt = move(desc, pos, action)
                if desc[nxt[0]][nxt[1]] != "H" and (desc[pos[0]][pos[1]] != "G"):
                    yield action, nxt

        return shortest_plan(self.env.pos, lambda p: p == cell, successors)

    def examples(self) -> list[Subgoals]:
        out: list[Subgoals] = []
        for desc, pos in EXAMPLES:
            env = FrozenLake(desc=desc)
            env.reset()
            env.pos = pos
            out.append(FrozenLakeSubgoals(env))
        return out


# ---------------------------------------------------------------------------------------------- Sokoban


class SokobanSubgoals(CellSubgoals):
    """Sokoban's subgoals: a box on a target, named by the target's cell ``"<row> <col>"`` (``BOX <row> <col>``).

    Valid: an empty target onto which some box can be pushed from the current position (a breadth-first search over
    positions that skips cornered boxes, as the env's oracle does). Progress: the number of boxes on targets, the
    task's natural milestones; the hindsight label names the targets that hold a box.
    """

    verb = "BOX"
    format = "BOX <row> <col>"
    env: Sokoban

    def invalid(self, cell: Cell) -> str:
        name = f"{cell[0]} {cell[1]}"
        if cell not in self.env.puzzle.targets or cell in self.env.puzzle.boxes:
            return f"Cell {name} is not an empty target (O): choose one."
        if self._plan(cell) is None:
            return f"No box can be pushed onto {name} from here: choose another target."
        return ""

    def reached(self, subgoal: str) -> bool:
        return _cell_of(subgoal) in self.env.puzzle.boxes

    def label(self) -> str:
        covered = sorted(self.env.puzzle.boxes & self.env.puzzle.targets)
        return "boxes on " + ", ".join(f"{r} {c}" for r, c in covered) if covered else "no box on a target"

    def progress(self) -> float:
        return float(len(self.env.puzzle.boxes & self.env.puzzle.targets))

    def where(self) -> str:
        p = self.env.puzzle
        empty = ", ".join(f"{r} {c}" for r, c in sorted(p.targets - p.boxes))
        return (f"P is at row {p.player[0]}, column {p.player[1]}; empty targets at {empty} "
                "(rows and columns count from 0 at the top left).")

    def describe(self, subgoal: str) -> str:
        cell = _cell_of(subgoal)
        return f"push a box onto the target at row {cell[0]}, column {cell[1]} ({_offset(self.env.puzzle.player, cell)} of P)"

    def propose(self, horizon: int) -> str:
        """The first target a shortest solution covers (Sokoban's milestones are boxes on targets, so ``horizon`` is
        not used); the first empty target when no solution is found."""
        puzzle, before = self.env.puzzle, self.env.puzzle.boxes & self.env.puzzle.targets
        for action in solve(puzzle) or []:
            puzzle = puzzle.moved(action)
            if new := sorted((puzzle.boxes & puzzle.targets) - before):
                return f"BOX {new[0][0]} {new[0][1]}"
        r, c = min(self.env.puzzle.targets - self.env.puzzle.boxes)
        return f"BOX {r} {c}"

    def toward(self, subgoal: str) -> str:
        plan = self._plan(_cell_of(subgoal)) if subgoal else None
        return plan[0] if plan else ""

    def _plan(self, cell: Cell) -> list[str] | None:
        """A shortest action list that puts some box on ``cell``, or None."""

        def successors(puzzle: Puzzle):
            if not puzzle.deadlocked:
                yield from ((action, puzzle.moved(action)) for action in SOKOBAN_ACTIONS)

        return shortest_plan(self.env.puzzle, lambda puzzle: cell in puzzle.boxes, successors, max_states=200_000)

    def examples(self) -> list[Subgoals]:
        out: list[Subgoals] = []
        for observation, _ in Sokoban().examples():
            env = Sokoban()
            env.puzzle = Puzzle.parse(observation.splitlines())
            out.append(SokobanSubgoals(env))
        return out


class FrozenLakeHierarchy(Hierarchy):
    """``frozenlake-hier-v0``: a random ``size`` x ``size`` FrozenLake map per seed (as ``frozenlake-v0`` draws it),
    a planner naming cells and an executor walking to them; the executor has ``executor_turns`` turns.
    ``progress_reward`` > 0 adds the flat env's oracle-progress shaping (``env.progress_reward`` of
    ``frozenlake-8x8-v0``) to the wrapped env, so both roles get it (the planner its segment's sum)."""

    def __init__(self, size: int = 8, p_frozen: float = 0.8, executor_turns: int = 24, every: int = 4,
                 milestone_reward: float = 0.5, hindsight_reward: float = 0.25, progress_reward: float = 0.0) -> None:
        env = make("frozenlake-v0", size=size, p_frozen=p_frozen, max_turns=executor_turns, progress_reward=progress_reward)
        super().__init__(env, FrozenLakeSubgoals(env.unwrapped), every, milestone_reward, hindsight_reward)


class SokobanHierarchy(Hierarchy):
    """``sokoban-hier-v0``: a seeded ``size`` x ``size`` Sokoban room with ``num_boxes`` boxes per seed (as ``sokoban-v0``
    draws it), a planner naming the target to fill next and an executor pushing; the executor has ``executor_turns``
    turns; ``progress_reward`` as :class:`FrozenLakeHierarchy`'s."""

    def __init__(self, size: int = 6, num_boxes: int = 2, min_solution: int = 8, max_solution: int = 16,
                 executor_turns: int = 30, every: int = 8, milestone_reward: float = 0.5, hindsight_reward: float = 0.25,
                 progress_reward: float = 0.0) -> None:
        env = make("sokoban-v0", size=size, num_boxes=num_boxes, min_solution=min_solution, max_solution=max_solution,
                   max_turns=executor_turns, progress_reward=progress_reward)
        super().__init__(env, SokobanSubgoals(env.unwrapped), every, milestone_reward, hindsight_reward)
