"""Sokoban as text, with seeded procedural puzzles that are solvable by construction.

Actions ``Up``, ``Down``, ``Left``, ``Right`` move the player; walking into a box pushes it one cell when
the cell behind it is free (not a wall, not a box); otherwise nothing moves. Boxes cannot be pulled.

- All boxes on targets: terminated, success, outcome reward 1.
- A box off target in a corner (a wall above or below it *and* a wall left or right of it) can never
  move again, so the puzzle is lost: terminated, no success, reward 0, ``info["deadlock"] = True``.
  Other deadlocks (boxes against each other, along a wall) are not detected; those episodes run into
  the turn limit (truncation).

Generation (the idea of gym-sokoban / Boxoban's reverse playing, made exhaustive): a square room walled
on its border with a few random interior walls (redrawn until the floor is connected), boxes on randomly
chosen targets, then a breadth-first search of *reverse* moves from every solved state, where the player
may pull the box behind it. A reverse move is exactly undone by a forward move, so the BFS depth of a
state is its shortest solution length. The start state is drawn from the states whose depth lies in
``[min_solution, max_solution]`` (the depth uniformly, then a state of that depth uniformly), so every
puzzle is solvable, not already solved, and of controlled difficulty. ``reset`` puts that length in
``info["optimal_length"]``. One ``random.Random`` per env, reseeded by ``reset(seed=s)``.

Text symbols (RAGEN's text convention, except ``*`` for a box on a target as in the XSB level format,
because ``√`` is two byte-level tokens in SmolLM2's tokenizer): ``#`` wall, ``_`` floor, ``O`` target,
``X`` box, ``*`` box on target, ``P`` player, ``S`` player on target. Cells are separated by spaces, one
token per cell, as in FrozenLake; a 6x6 room is about 41 tokens.

With ``show_hints`` (off by default) a line follows the grid, as FrozenLake's neighbour hint does: what lies one
step in each direction (a box says whether it can be pushed that way) and where the nearest box off target and its
nearest free target are, e.g. ``Up: wall, Down: floor, Left: box (push), Right: floor; box 1 left; its target
2 down 1 left of it``. It states what the grid shows, not which move to make; it is also the env's ``situation()``.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from turnrl.envs.base import Env
from turnrl.envs.grid import Pos, manhattan, offsets
from turnrl.envs.parsing import parse_actions
from turnrl.envs.search import shortest_plan

State = tuple[Pos, frozenset[Pos]]  # (player, boxes)

ACTIONS = ("Up", "Down", "Left", "Right")
MOVES: dict[str, Pos] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
INVALID_FEEDBACK = "Invalid action. Answer with one of: Up, Down, Left, Right."
DEADLOCK_LINE = "Deadlock: a box is stuck in a corner."
# Fixed puzzles for the few-shot examples (not drawn from any seed). Oracle first moves: Down, Up.
_EXAMPLES = [
    ["#####", "#P__#", "#_X_#", "#__O#", "#####"],
    ["#####", "#O__#", "#_X_#", "#__P#", "#####"],
]
_INTERIOR_WALL_P = 0.12


@dataclass(frozen=True)
class Puzzle:
    """A Sokoban position: the static layout (walls, targets) and the dynamic state (player, boxes)."""

    walls: frozenset[Pos]
    targets: frozenset[Pos]
    player: Pos
    boxes: frozenset[Pos]
    shape: tuple[int, int]  # (rows, columns)

    @classmethod
    def parse(cls, rows: list[str]) -> Puzzle:
        """Read rows of symbols (spaces between cells are ignored, so ``parse`` reads ``render``'s output)."""
        grid = [row.replace(" ", "") for row in rows]
        cells = {(r, c): ch for r, row in enumerate(grid) for c, ch in enumerate(row)}
        players = [p for p, ch in cells.items() if ch in "PS"]
        if len(players) != 1 or set(cells.values()) - set("#_OX*PS"):
            raise ValueError(f"a Sokoban puzzle needs exactly one P or S and only the symbols # _ O X * P S: {rows!r}")
        return cls(
            walls=frozenset(p for p, ch in cells.items() if ch == "#"),
            targets=frozenset(p for p, ch in cells.items() if ch in "O*S"),
            player=players[0],
            boxes=frozenset(p for p, ch in cells.items() if ch in "X*"),
            shape=(len(grid), max(len(row) for row in grid)),
        )

    def render(self) -> str:
        """The grid, one line per row, cells separated by spaces."""
        return "\n".join(" ".join(self._symbol((r, c)) for c in range(self.shape[1])) for r in range(self.shape[0]))

    def _symbol(self, p: Pos) -> str:
        if p in self.walls:
            return "#"
        if p == self.player:
            return "S" if p in self.targets else "P"
        if p in self.boxes:
            return "*" if p in self.targets else "X"
        return "O" if p in self.targets else "_"

    @property
    def state(self) -> State:
        return self.player, self.boxes

    @property
    def solved(self) -> bool:
        return self.boxes == self.targets

    @property
    def deadlocked(self) -> bool:
        """Whether a box off target sits in a corner, from where it can never move."""
        return any(_cornered(self.walls, box) for box in self.boxes - self.targets)

    def hint(self) -> str:
        """The ``show_hints`` line (module docstring): the four neighbours, then the nearest box off target and the
        nearest free target to it, as offsets."""
        blocked = self.walls | self.boxes
        words = []
        for action, (dr, dc) in MOVES.items():
            cell = (self.player[0] + dr, self.player[1] + dc)
            if cell in self.boxes:
                word = "box (stuck)" if (cell[0] + dr, cell[1] + dc) in blocked else "box (push)"
            else:
                word = "wall" if cell in self.walls else "target" if cell in self.targets else "floor"
            words.append(f"{action}: {word}")
        line = ", ".join(words)
        loose = self.boxes - self.targets
        if loose:
            box = min(loose, key=lambda b: (manhattan(b, self.player), b))
            target = min(self.targets - self.boxes, key=lambda t: (manhattan(t, box), t))
            line += f"; box {_offset(box, self.player)}; its target {_offset(target, box)} of it"
        return line

    def moved(self, action: str) -> Puzzle:
        """The position after ``action`` (itself when the move is blocked)."""
        player, boxes = _forward(self.walls, self.state, action)
        return Puzzle(self.walls, self.targets, player, boxes, self.shape)


def _offset(p: Pos, origin: Pos) -> str:
    """Where ``p`` lies from ``origin`` in words: ``2 down 1 left`` (``here`` when they coincide)."""
    return " ".join(f"{n} {word}" for n, word in offsets(p, origin)) or "here"


def _forward(walls: frozenset[Pos], state: State, action: str) -> State:
    (r, c), boxes = state
    dr, dc = MOVES[action]
    nxt = (r + dr, c + dc)
    if nxt in walls:
        return state
    if nxt in boxes:
        beyond = (r + 2 * dr, c + 2 * dc)
        if beyond in walls or beyond in boxes:
            return state
        return nxt, (boxes - {nxt}) | {beyond}
    return nxt, boxes


def _reverse(walls: frozenset[Pos], state: State) -> list[State]:
    """Every state from which one forward move leads to ``state``: step back, or step back pulling a box."""
    (r, c), boxes = state
    out = []
    for dr, dc in MOVES.values():
        back = (r - dr, c - dc)  # where the player came from
        if back in walls or back in boxes:
            continue
        out.append((back, boxes))
        pushed = (r + dr, c + dc)  # a box the forward move would have pushed here
        if pushed in boxes:
            out.append((back, (boxes - {pushed}) | {(r, c)}))
    return out


def _cornered(walls: frozenset[Pos], p: Pos) -> bool:
    r, c = p
    return ((r - 1, c) in walls or (r + 1, c) in walls) and ((r, c - 1) in walls or (r, c + 1) in walls)


def solve(puzzle: Puzzle, max_states: int = 200_000) -> list[str] | None:
    """BFS over (player, boxes): a shortest action list to the solved state.

    Ties break by the action order Up, Down, Left, Right. Returns None when the puzzle is unsolvable, or
    when no solution is found within ``max_states`` visited states (generated puzzles stay far below).
    States with a cornered box are not expanded (no solution passes through them).
    """
    def successors(state: State):
        if any(_cornered(puzzle.walls, box) for box in state[1] - puzzle.targets):
            return
        for action in ACTIONS:
            yield action, _forward(puzzle.walls, state, action)

    return shortest_plan(puzzle.state, lambda state: state[1] == puzzle.targets, successors, max_states)


def generate(
    rng: random.Random, size: int, num_boxes: int, min_solution: int, max_solution: int,
    max_states: int = 100_000, tries: int = 100,
) -> tuple[Puzzle, int]:
    """A puzzle whose shortest solution has between ``min_solution`` and ``max_solution`` moves, and that length.

    See the module docstring. Raises ``RuntimeError`` when ``tries`` rooms in a row offer no such puzzle
    (room too small for the requested length or box count).
    """
    interior = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
    border = {(r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1)}
    for _ in range(tries):
        walls = frozenset(border | {p for p in interior if rng.random() < _INTERIOR_WALL_P})
        floor = [p for p in interior if p not in walls]
        if len(floor) < num_boxes + 2 or not _connected(floor):
            continue
        targets = frozenset(rng.sample(floor, num_boxes))
        by_depth = _reverse_layers(walls, targets, floor, max_solution, max_states)
        depths = [d for d in range(min_solution, max_solution + 1) if by_depth.get(d)]
        if not depths:
            continue
        depth = rng.choice(depths)
        player, boxes = rng.choice(by_depth[depth])
        return Puzzle(walls, targets, player, boxes, (size, size)), depth
    raise RuntimeError(
        f"no {size}x{size} room with {num_boxes} box(es) gave a puzzle of {min_solution}-{max_solution} moves "
        f"in {tries} tries; use a larger size, fewer boxes or a smaller min_solution"
    )


def _reverse_layers(
    walls: frozenset[Pos], targets: frozenset[Pos], floor: list[Pos], max_depth: int, max_states: int,
) -> dict[int, list[State]]:
    """States by shortest-solution length, from a BFS of reverse moves out of every solved state."""
    layer = [(p, targets) for p in floor if p not in targets]
    seen = set(layer)
    layers = {0: layer}
    for depth in range(1, max_depth + 1):
        nxt = []
        for state in layer:
            for prev in _reverse(walls, state):
                if prev not in seen:
                    seen.add(prev)
                    nxt.append(prev)
        if not nxt or len(seen) > max_states:
            break
        layers[depth] = layer = nxt
    return layers


def _connected(cells: list[Pos]) -> bool:
    remaining = set(cells)
    queue = deque([cells[0]])
    remaining.discard(cells[0])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            n = (r + dr, c + dc)
            if n in remaining:
                remaining.discard(n)
                queue.append(n)
    return not remaining


class Sokoban(Env):
    """Push every box onto a target (see the module docstring).

    Args:
        size: side of the square room, border walls included.
        num_boxes: boxes (and targets) per puzzle.
        max_actions_per_turn: how many actions one response may carry; extra ones are ignored.
        min_solution, max_solution: the range of shortest-solution lengths puzzles are drawn from.
        show_hints: add the line naming the neighbours and where the box and its target are (module docstring).
    """

    instructions = (
        "You play Sokoban. The grid shows you (P, or S on a target), boxes (X, or * on a target), "
        "targets (O), walls (#) and floor (_). Walk into a box to push it; boxes cannot be pulled. "
        "Push every box onto a target. Answer with one action word: Up, Down, Left or Right, "
        "for example <answer>Up</answer>."
    )

    def __init__(
        self, size: int = 6, num_boxes: int = 1, max_actions_per_turn: int = 1, min_solution: int = 4, max_solution: int = 10,
        show_hints: bool = False,
    ) -> None:
        if not 5 <= size <= 10:
            raise ValueError(f"size={size} must be between 5 and 10")
        if not 1 <= num_boxes <= 3:
            raise ValueError(f"num_boxes={num_boxes} must be between 1 and 3")
        if max_actions_per_turn < 1:
            raise ValueError(f"max_actions_per_turn={max_actions_per_turn} must be >= 1")
        if not 1 <= min_solution <= max_solution:
            raise ValueError(f"need 1 <= min_solution <= max_solution, got {min_solution} and {max_solution}")
        self.size, self.num_boxes, self.max_actions_per_turn = size, num_boxes, max_actions_per_turn
        self.min_solution, self.max_solution = min_solution, max_solution
        self.show_hints = show_hints
        self._rng = random.Random()
        self.puzzle = self.start = Puzzle.parse(_EXAMPLES[0])
        self.done = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Draw the puzzle for ``seed``. ``info["optimal_length"]`` is its shortest solution length."""
        if seed is not None:
            self._rng = random.Random(seed)
        self.puzzle, length = generate(self._rng, self.size, self.num_boxes, self.min_solution, self.max_solution)
        self.start, self.done = self.puzzle, False
        return self.render(), {"optimal_length": length}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Execute up to ``max_actions_per_turn`` actions parsed from ``action_text``; a turn stops at the end.

        Text without an action leaves the state unchanged: the observation is the feedback line plus the
        current state, reward 0, ``info["valid"] = False``. Reward components: ``"outcome"`` (1.0 when solved).
        ``info["deadlock"]`` says whether a box got cornered. Calling ``step`` after termination raises
        ``RuntimeError``.
        """
        if self.done:
            raise RuntimeError("step() after the episode terminated; call reset() first")
        actions = parse_actions(action_text, ACTIONS, self.max_actions_per_turn)
        if not actions:
            info = {"actions": [], "valid": False, "success": False, "reward_components": {"outcome": 0.0}, "deadlock": False}
            return f"{INVALID_FEEDBACK}\n{self.render()}", 0.0, False, False, info
        executed = []
        for action in actions:
            self.puzzle = self.puzzle.moved(action)
            executed.append(action)
            if self.puzzle.solved or self.puzzle.deadlocked:
                break
        success, deadlock = self.puzzle.solved, self.puzzle.deadlocked
        self.done = success or deadlock
        reward = 1.0 if success else 0.0
        info = {
            "actions": executed, "valid": True, "success": success, "reward_components": {"outcome": reward}, "deadlock": deadlock,
        }
        return self.render(), reward, self.done, False, info

    def anchor(self) -> str:
        """The rendered grid: layout, boxes and player, without history."""
        return self.puzzle.render()

    def task_key(self) -> str:
        """The puzzle as it started (walls, targets, boxes, player), rows joined by ``/``."""
        return self.start.render().replace(" ", "").replace("\n", "/")

    def solve(self) -> list[str] | None:
        return solve(self.puzzle)

    def examples(self) -> list[tuple[str, str]]:
        """Two (observation, oracle action word) pairs on fixed 5x5 puzzles."""
        out = []
        for rows in _EXAMPLES:
            puzzle = Puzzle.parse(rows)
            plan = solve(puzzle)
            assert plan, "few-shot example puzzles must be solvable"
            out.append((self._text(puzzle), plan[0]))
        return out

    def situation(self) -> str:
        """The hint line (neighbours, the box's and its target's offsets): what recurs across puzzles."""
        return self.puzzle.hint()

    def render(self) -> str:
        return self._text(self.puzzle)

    def _text(self, puzzle: Puzzle) -> str:
        text = puzzle.render() + (f"\n{puzzle.hint()}" if self.show_hints else "")
        return f"{text}\n{DEADLOCK_LINE}" if puzzle.deadlocked else text
