"""FrozenLake as text, with Gymnasium's semantics (``gymnasium.envs.toy_text.frozen_lake``).

Actions ``Left``, ``Down``, ``Right``, ``Up``. Map symbols: ``S`` start, ``F`` frozen, ``H`` hole, ``G`` goal.
A move into the wall leaves the player in place. Reaching ``G`` terminates with success and outcome reward
1; falling into ``H`` terminates with reward 0 and no success. In slippery mode the player moves in the
intended direction with probability 1/3 and in each perpendicular direction with 1/3, never backwards
(Gymnasium's ``is_slippery=True``). Each action of a turn slips independently; a turn stops at a hole or
the goal, and ``info["actions"]`` lists the actions executed (as intended, not as slipped).

Maps: Gymnasium's standard ``4x4`` and ``8x8``, an explicit ``desc``, or ``random`` maps (the default) drawn
like Gymnasium's ``generate_random_map`` (same distribution, not the same draws): each cell frozen with
probability ``p_frozen``, ``S`` top-left, ``G`` bottom-right, redrawn until a path from S to G exists.

Randomness: one ``random.Random`` per env. ``reset(seed=s)`` reseeds it, so the same seed gives the same map
and the same slips; ``reset()`` without a seed continues it. The global RNG is never used.

Rendering is compact because every prompt token costs training time on a small model. The default
(``grid="compact"``) writes each row as one string (``PFFF``) followed, with ``show_hints``, by one line
naming what lies one step in each direction; ``grid="spaced"`` separates cells (``P F F F``: exactly one
token per cell with SmolLM2's tokenizer, so a column is the same token position in every row) and
``show_goal`` adds the goal's offset. Measured with the default recipe on this project's 2-core machine
(bench/RESULTS.md): the compact grid with the neighbour line reached 91% greedy success on held-out maps
after 20 steps; the spaced grid with the goal line reached 28-39% in the same budget. A 4x4 observation::

    PFFF
    FHFH
    FFFH
    HFFG
    Left: wall, Down: frozen, Right: frozen, Up: wall

A terminal observation ends with ``You reached the goal.`` or ``You fell into a hole.`` instead of hints.
"""

from __future__ import annotations

import random
from typing import Any

from turnrl.envs.base import Env
from turnrl.envs.grid import Pos, manhattan, offsets
from turnrl.envs.parsing import parse_actions
from turnrl.envs.search import shortest_plan


ACTIONS = ("Left", "Down", "Right", "Up")  # Gymnasium's action order 0..3
MOVES: dict[str, Pos] = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
# Gymnasium's slips: action i moves as (i - 1) % 4, i or (i + 1) % 4, each with probability 1/3.
SLIPS = {a: (ACTIONS[(i - 1) % 4], a, ACTIONS[(i + 1) % 4]) for i, a in enumerate(ACTIONS)}

MAPS = {
    "4x4": ["SFFF", "FHFH", "FFFH", "HFFG"],
    "8x8": ["SFFFFFFF", "FFFFFFFF", "FFFHFFFF", "FFFFFHFF", "FFFHFFFF", "FHHFFFHF", "FHFFHFHF", "FFFHFFFG"],
}
INVALID_FEEDBACK = "Invalid action. Answer with one of: Left, Down, Right, Up."
_CELL_NAMES = {"S": "frozen", "F": "frozen", "H": "hole", "G": "goal"}
# Fixed maps and positions for the few-shot examples; not drawn from any seed. Oracle moves: Down, Right.
EXAMPLES: list[tuple[list[str], Pos]] = [(["SFFF", "FHFH", "FFFH", "HFFG"], (0, 0)), (["SFFH", "HFFF", "FFHF", "HHFG"], (1, 1))]


def shortest_path(desc: list[str], start: Pos) -> list[str] | None:
    """BFS over deterministic moves from ``start`` to a ``G`` avoiding holes; None if no path exists.

    Ties between equally short paths break by the action order Left, Down, Right, Up.
    """
    if desc[start[0]][start[1]] == "H":
        return None

    def successors(pos: Pos):
        for action in ACTIONS:
            nxt = move(desc, pos, action)
            if desc[nxt[0]][nxt[1]] != "H":
                yield action, nxt

    return shortest_plan(start, lambda pos: desc[pos[0]][pos[1]] == "G", successors)


def random_map(rng: random.Random, size: int = 4, p_frozen: float = 0.8) -> list[str]:
    """A ``size`` x ``size`` map with a path from ``S`` (top-left) to ``G`` (bottom-right), drawn from ``rng``."""
    while True:
        grid = [["F" if rng.random() < p_frozen else "H" for _ in range(size)] for _ in range(size)]
        grid[0][0], grid[-1][-1] = "S", "G"
        desc = ["".join(row) for row in grid]
        if shortest_path(desc, (0, 0)) is not None:
            return desc


def move(desc: list[str], pos: Pos, action: str) -> Pos:
    """Where ``action`` leads from ``pos``; a move into the wall stays in place."""
    dr, dc = MOVES[action]
    r, c = pos[0] + dr, pos[1] + dc
    return (r, c) if 0 <= r < len(desc) and 0 <= c < len(desc[0]) else pos


def _validate_desc(desc: list[str]) -> None:
    if not desc or any(len(row) != len(desc[0]) for row in desc) or not desc[0]:
        raise ValueError(f"desc={desc!r} must be a non-empty list of equally long row strings")
    cells = "".join(desc)
    if set(cells) - set("SFHG") or cells.count("S") != 1 or "G" not in cells:
        raise ValueError(f"desc={desc!r} must use only S, F, H, G, with exactly one S and at least one G")


class FrozenLake(Env):
    """Walk from ``S`` to ``G`` on a frozen lake without falling into a hole ``H`` (see the module docstring).

    Args:
        map_name: ``"4x4"`` or ``"8x8"`` (Gymnasium's maps) or ``"random"`` (a solvable map per seed).
        size: side of random maps.
        p_frozen: probability that a cell of a random map is frozen.
        slippery: Gymnasium's ``is_slippery``: each move goes as intended or sideways, 1/3 each.
        desc: an explicit map (row strings); overrides ``map_name``.
        max_actions_per_turn: how many actions one response may carry; extra ones are ignored.
        show_hints: add the line naming what lies one step in each direction.
        show_goal: add the line giving the goal's offset (``Goal: 3 down, 3 right``).
        grid: ``"compact"`` rows (``PFFF``) or ``"spaced"`` cells (``P F F F``, one token per cell).
    """

    instructions = (
        "You play FrozenLake. Move the player P to the goal G without stepping into a hole H. "
        "Answer with one action: Left, Down, Right or Up."
    )

    def __init__(
        self,
        map_name: str = "random",
        size: int = 4,
        p_frozen: float = 0.8,
        slippery: bool = False,
        desc: list[str] | None = None,
        max_actions_per_turn: int = 1,
        show_hints: bool = True,
        show_goal: bool = False,
        grid: str = "compact",
    ) -> None:
        if map_name not in (*MAPS, "random"):
            raise ValueError(f"map_name={map_name!r} must be one of {[*MAPS, 'random']}")
        if not 2 <= size <= 16:
            raise ValueError(f"size={size} must be between 2 and 16")
        if not 0.0 < p_frozen <= 1.0:
            raise ValueError(f"p_frozen={p_frozen} must be in (0, 1]")
        if max_actions_per_turn < 1:
            raise ValueError(f"max_actions_per_turn={max_actions_per_turn} must be >= 1")
        if grid not in ("compact", "spaced"):
            raise ValueError(f"grid={grid!r} must be 'compact' or 'spaced'")
        if desc is not None:
            _validate_desc(desc)
        self.map_name, self.size, self.p_frozen, self.slippery = map_name, size, p_frozen, slippery
        self.fixed_desc = list(desc) if desc is not None else None
        self.max_actions_per_turn, self.show_hints = max_actions_per_turn, show_hints
        self.show_goal, self.grid = show_goal, grid
        self._rng = random.Random()
        self.desc: list[str] = self.fixed_desc or MAPS.get(map_name, MAPS["4x4"])
        self.pos: Pos = (0, 0)
        self.done = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start on the map for ``seed`` (random maps) at ``S``. ``info["map"]`` holds the map rows."""
        if seed is not None:
            self._rng = random.Random(seed)
        if self.fixed_desc is not None:
            self.desc = self.fixed_desc
        elif self.map_name == "random":
            self.desc = random_map(self._rng, self.size, self.p_frozen)
        else:
            self.desc = MAPS[self.map_name]
        self.pos = next((r, c) for r, row in enumerate(self.desc) for c, ch in enumerate(row) if ch == "S")
        self.done = False
        return self.render(), {"map": list(self.desc)}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Execute up to ``max_actions_per_turn`` actions parsed from ``action_text``.

        Text without an action leaves the state unchanged: the observation is the feedback line plus the
        current state, reward 0, ``info["valid"] = False``. Reward components: ``"outcome"`` (1.0 on the goal).
        Calling ``step`` after termination is an error (``RuntimeError``): call ``reset``.
        """
        if self.done:
            raise RuntimeError("step() after the episode terminated; call reset() first")
        actions = parse_actions(action_text, ACTIONS, self.max_actions_per_turn)
        if not actions:
            info = {"actions": [], "valid": False, "success": False, "reward_components": {"outcome": 0.0}}
            return f"{INVALID_FEEDBACK}\n{self.render()}", 0.0, False, False, info
        executed = []
        for action in actions:
            moved = self._rng.choice(SLIPS[action]) if self.slippery else action
            self.pos = move(self.desc, self.pos, moved)
            executed.append(action)
            if self.cell in "HG":
                break
        success = self.cell == "G"
        self.done = self.cell in "HG"
        reward = 1.0 if success else 0.0
        info = {"actions": executed, "valid": True, "success": success, "reward_components": {"outcome": reward}}
        return self.render(), reward, self.done, False, info

    def anchor(self) -> str:
        """``"<rows joined by />@<row>,<col>"``: the map and the player's position."""
        return "/".join(self.desc) + f"@{self.pos[0]},{self.pos[1]}"

    def situation(self) -> str:
        """``"Left: frozen, Down: hole, Right: wall, Up: frozen; goal down-right"``: the neighbour cells (as the hint
        line names them, shown or not) and the nearest goal's direction, with no map or position."""
        return f"{_neighbours(self.desc, self.pos)}; goal {_goal_direction(self.desc, self.pos)}"

    def task_key(self) -> str:
        """The map's rows joined by ``/`` (the layout with its start and goals): seeds that draw the same map
        are the same task."""
        return "/".join(self.desc)

    def solve(self) -> list[str] | None:
        """The shortest deterministic path to the goal (also in slippery mode, where it may not succeed)."""
        return shortest_path(self.desc, self.pos)

    def examples(self) -> list[tuple[str, str]]:
        """Two (observation, oracle action word) pairs on fixed 4x4 maps, rendered like real observations."""
        out = []
        for desc, pos in EXAMPLES:
            path = shortest_path(desc, pos)
            assert path, "few-shot example maps must be solvable"
            out.append((self._render(desc, pos), path[0]))
        return out

    def render(self) -> str:
        return self._render(self.desc, self.pos)

    @property
    def cell(self) -> str:
        """The map symbol under the player."""
        return self.desc[self.pos[0]][self.pos[1]]

    def _render(self, desc: list[str], pos: Pos) -> str:
        sep = " " if self.grid == "spaced" else ""
        lines = [sep.join("P" if (r, c) == pos else ch for c, ch in enumerate(row)) for r, row in enumerate(desc)]
        cell = desc[pos[0]][pos[1]]
        if cell == "G":
            lines.append("You reached the goal.")
        elif cell == "H":
            lines.append("You fell into a hole.")
        elif self.show_hints:
            lines.append(_neighbours(desc, pos))
        if self.show_goal and cell not in "GH":
            lines.append(f"Goal: {_direction_to_goal(desc, pos)}")
        return "\n".join(lines)


def _neighbours(desc: list[str], pos: Pos) -> str:
    """The hint line: ``"Left: frozen, Down: hole, Right: wall, Up: frozen"``."""
    around = []
    for action in ACTIONS:
        nxt = move(desc, pos, action)
        around.append(f"{action}: {'wall' if nxt == pos else _CELL_NAMES[desc[nxt[0]][nxt[1]]]}")
    return ", ".join(around)


def _goal_direction(desc: list[str], pos: Pos) -> str:
    """``"down-right"``, ``"up"``, ``"here"``: the directions of the nearest goal, without distances."""
    words = [word for _, word in _goal_offsets(desc, pos)]
    return "-".join(words) if words else "here"


def _direction_to_goal(desc: list[str], pos: Pos) -> str:
    """``"2 down, 3 right"``: rows then columns from ``pos`` to the nearest ``G``; zero offsets are left out."""
    return ", ".join(f"{n} {word}" for n, word in _goal_offsets(desc, pos))


def _goal_offsets(desc: list[str], pos: Pos) -> list[tuple[int, str]]:
    """``[(2, "down"), (3, "right")]``: the nonzero row then column distances from ``pos`` to the nearest ``G``."""
    goals = [(r, c) for r, row in enumerate(desc) for c, ch in enumerate(row) if ch == "G"]
    return offsets(min(goals, key=lambda g: manhattan(g, pos)), pos)
