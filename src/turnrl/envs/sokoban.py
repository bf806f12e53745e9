"""Sokoban as text, with seeded procedural puzzles that are solvable by construction (and checked).

Actions ``Up``, ``Down``, ``Left``, ``Right`` move the player; walking into a box pushes it when the cell
behind it is free. All boxes on targets terminates with success and outcome reward 1. There is no
deadlock detection: an unsolvable position simply runs into the turn limit (truncation).

Generation (as in gym-sokoban / Boxoban): a walled room with a few random interior walls, boxes placed on
targets, then a random walk of *reverse* moves from that solved state in which the player may pull a box
behind it. Every reverse move can be undone by a push, so the start state is solvable; the BFS solver
confirms it and a puzzle that is already solved or needs more than ``max_solution`` moves is redrawn.

Text symbols (gym-sokoban's text convention): ``#`` wall, ``_`` floor, ``O`` target, ``X`` box, ``√`` box on
target, ``P`` player, ``S`` player on target.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from turnrl.envs.base import Env
from turnrl.envs.parsing import parse_actions

ACTIONS = ("Up", "Down", "Left", "Right")
MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
Pos = tuple[int, int]

# A fixed puzzle for the few-shot examples (not drawn from any seed).
_EXAMPLE = ["#####", "#P__#", "#_X_#", "#__O#", "#####"]


class Puzzle:
    """Static layout (walls, targets) plus the dynamic state (player, boxes)."""

    def __init__(self, walls: set[Pos], targets: frozenset[Pos], player: Pos, boxes: frozenset[Pos], size: tuple[int, int]):
        self.walls, self.targets, self.player, self.boxes, self.size = walls, targets, player, boxes, size

    @classmethod
    def parse(cls, rows: list[str]) -> "Puzzle":
        walls, targets, boxes = set(), set(), set()
        player = (0, 0)
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                if ch == "#":
                    walls.add((r, c))
                if ch in "O√S":
                    targets.add((r, c))
                if ch in "X√":
                    boxes.add((r, c))
                if ch in "PS":
                    player = (r, c)
        return cls(walls, frozenset(targets), player, frozenset(boxes), (len(rows), len(rows[0])))

    def render(self) -> str:
        rows = []
        for r in range(self.size[0]):
            line = []
            for c in range(self.size[1]):
                p = (r, c)
                if p in self.walls:
                    line.append("#")
                elif p == self.player:
                    line.append("S" if p in self.targets else "P")
                elif p in self.boxes:
                    line.append("√" if p in self.targets else "X")
                else:
                    line.append("O" if p in self.targets else "_")
            rows.append("".join(line))
        return "\n".join(rows)

    @property
    def solved(self) -> bool:
        return self.boxes == self.targets

    def push(self, action: str) -> tuple[Pos, frozenset[Pos]]:
        """The (player, boxes) after ``action``; unchanged when blocked."""
        dr, dc = MOVES[action]
        nxt = (self.player[0] + dr, self.player[1] + dc)
        if nxt in self.walls:
            return self.player, self.boxes
        if nxt in self.boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if beyond in self.walls or beyond in self.boxes:
                return self.player, self.boxes
            return nxt, (self.boxes - {nxt}) | {beyond}
        return nxt, self.boxes


def solve(puzzle: Puzzle, max_states: int = 200_000) -> list[str] | None:
    """BFS over (player, boxes): a shortest push/move sequence to the solved state, None if none is found."""
    start = (puzzle.player, puzzle.boxes)
    prev: dict[tuple[Pos, frozenset[Pos]], tuple[tuple[Pos, frozenset[Pos]], str] | None] = {start: None}
    queue = deque([start])
    probe = Puzzle(puzzle.walls, puzzle.targets, puzzle.player, puzzle.boxes, puzzle.size)
    while queue and len(prev) <= max_states:
        state = queue.popleft()
        if state[1] == puzzle.targets:
            path = []
            while prev[state] is not None:
                state, action = prev[state]  # type: ignore[misc]
                path.append(action)
            return path[::-1]
        probe.player, probe.boxes = state
        for action in ACTIONS:
            nxt = probe.push(action)
            if nxt not in prev:
                prev[nxt] = (state, action)
                queue.append(nxt)
    return None


def generate(rng: random.Random, size: int, num_boxes: int, max_solution: int = 30, tries: int = 200) -> Puzzle:
    """A solvable, not-yet-solved puzzle drawn from ``rng`` (see the module docstring)."""
    for _ in range(tries):
        walls = {(r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1)}
        interior = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
        for p in interior:
            if rng.random() < 0.12:
                walls.add(p)
        free = [p for p in interior if p not in walls]
        if len(free) < num_boxes + 2 or not _connected(free):
            continue
        targets = frozenset(rng.sample(free, num_boxes))
        player = rng.choice([p for p in free if p not in targets])
        boxes = set(targets)
        for _ in range(rng.randint(6, 10 * num_boxes + 10)):  # reverse moves, pulling boxes
            action = rng.choice(ACTIONS)
            dr, dc = MOVES[action]
            nxt = (player[0] + dr, player[1] + dc)
            if nxt in walls or nxt in boxes:
                continue
            behind = (player[0] - dr, player[1] - dc)
            if behind in boxes and rng.random() < 0.8:
                boxes = (boxes - {behind}) | {player}
            player = nxt
        puzzle = Puzzle(walls, targets, player, frozenset(boxes), (size, size))
        if puzzle.solved:
            continue
        plan = solve(puzzle)
        if plan is not None and len(plan) <= max_solution:
            return puzzle
    raise RuntimeError(f"could not generate a solvable {size}x{size} puzzle with {num_boxes} boxes; try a larger size")


def _connected(cells: list[Pos]) -> bool:
    cells_set = set(cells)
    seen = {cells[0]}
    queue = deque([cells[0]])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            n = (r + dr, c + dc)
            if n in cells_set and n not in seen:
                seen.add(n)
                queue.append(n)
    return len(seen) == len(cells_set)


class Sokoban(Env):
    instructions = (
        "You play Sokoban. Push every box X onto a target O. # is a wall, _ is floor, P is you, "
        "√ is a box on a target. Answer with one action: Up, Down, Left or Right."
    )

    def __init__(self, size: int = 6, num_boxes: int = 1, max_actions_per_turn: int = 1, max_solution: int = 30) -> None:
        if not 5 <= size <= 12:
            raise ValueError(f"size={size} must be between 5 and 12")
        if not 1 <= num_boxes <= 4:
            raise ValueError(f"num_boxes={num_boxes} must be between 1 and 4")
        if max_actions_per_turn < 1:
            raise ValueError("max_actions_per_turn must be >= 1")
        self.size, self.num_boxes = size, num_boxes
        self.max_actions_per_turn, self.max_solution = max_actions_per_turn, max_solution
        self.puzzle = Puzzle.parse(_EXAMPLE)
        self.done = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self.puzzle = generate(random.Random(seed), self.size, self.num_boxes, self.max_solution)
        self.done = False
        return self.render(), {}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done:
            raise RuntimeError("step() after the episode terminated; call reset()")
        actions = parse_actions(action_text, ACTIONS, self.max_actions_per_turn)
        info: dict[str, Any] = {"actions": actions, "valid": bool(actions), "success": False, "reward_components": {"outcome": 0.0}}
        if not actions:
            return "Invalid action. Answer with one of: Up, Down, Left, Right.\n" + self.render(), 0.0, False, False, info
        for action in actions:
            self.puzzle.player, self.puzzle.boxes = self.puzzle.push(action)
            if self.puzzle.solved:
                break
        success = self.puzzle.solved
        self.done = success
        info.update(success=success, reward_components={"outcome": 1.0 if success else 0.0})
        return self.render(), 1.0 if success else 0.0, success, False, info

    def anchor(self) -> str:
        return self.render()

    def solve(self) -> list[str] | None:
        return solve(self.puzzle)

    def examples(self) -> list[tuple[str, str]]:
        puzzle = Puzzle.parse(_EXAMPLE)
        out = []
        for _ in range(2):
            plan = solve(puzzle)
            assert plan, "the example puzzle must be solvable"
            out.append((puzzle.render(), plan[0]))
            puzzle.player, puzzle.boxes = puzzle.push(plan[0])
        return out

    def render(self) -> str:
        return self.puzzle.render()
