"""FrozenLake as text, with Gymnasium's semantics.

Actions ``Left``, ``Down``, ``Right``, ``Up``. Map symbols: ``S`` start, ``F`` frozen, ``H`` hole, ``G`` goal.
A move into the wall leaves the player in place. Reaching ``G`` terminates with success and outcome reward 1;
falling into ``H`` terminates with reward 0. In slippery mode the intended move happens with probability
1/3 and each perpendicular move with 1/3 (never backwards), as in Gymnasium's ``is_slippery=True``.

Maps: Gymnasium's standard ``4x4`` and ``8x8``, an explicit ``desc``, or ``random`` maps (the default) drawn
from the reset seed, S top-left and G bottom-right, frozen with probability ``p_frozen``, redrawn until a
path exists (so every map is solvable).

Rendering is compact on purpose (every prompt token costs training time on a small model): the grid with
the player as ``P``, one line per row with no separators (``PFFH`` is 2-3 tokens with a BPE tokenizer), and,
with ``show_hints``, one line naming what lies in each direction (``Left: wall, Down: frozen, ...``).
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from turnrl.envs.base import Env
from turnrl.envs.parsing import parse_actions

ACTIONS = ("Left", "Down", "Right", "Up")
MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
# Gymnasium's perpendicular slips: for action a, the outcomes are (a-1) % 4, a, (a+1) % 4 in LDRU order.
_SLIPS = {a: (ACTIONS[(i - 1) % 4], a, ACTIONS[(i + 1) % 4]) for i, a in enumerate(ACTIONS)}

MAPS = {
    "4x4": ["SFFF", "FHFH", "FFFH", "HFFG"],
    "8x8": ["SFFFFFFF", "FFFFFFFF", "FFFHFFFF", "FFFFFHFF", "FFFHFFFF", "FHHFFFHF", "FHFFHFHF", "FFFHFFFG"],
}
_CELL_NAMES = {"S": "frozen", "F": "frozen", "H": "hole", "G": "goal"}
# Fixed maps for the few-shot examples; they are not drawn from any seed.
_EXAMPLES = [(["SFFF", "FHFH", "FFFH", "HFFG"], (0, 0)), (["SFFH", "HFFF", "FFHF", "HHFG"], (1, 1))]  # answers: Down, Right


def shortest_path(desc: list[str], start: tuple[int, int]) -> list[str] | None:
    """BFS over deterministic moves from ``start`` to ``G`` avoiding holes; None if unreachable."""
    n_rows, n_cols = len(desc), len(desc[0])
    if desc[start[0]][start[1]] == "H":
        return None
    prev: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if desc[pos[0]][pos[1]] == "G":
            path = []
            while prev[pos] is not None:
                pos, action = prev[pos]  # type: ignore[misc]
                path.append(action)
            return path[::-1]
        for action in ACTIONS:
            nxt = _move(pos, action, n_rows, n_cols)
            if nxt not in prev and desc[nxt[0]][nxt[1]] != "H":
                prev[nxt] = (pos, action)
                queue.append(nxt)
    return None


def random_map(rng: random.Random, size: int = 4, p_frozen: float = 0.8) -> list[str]:
    """A solvable random map (S top-left, G bottom-right), as Gymnasium's ``generate_random_map``."""
    while True:
        grid = [["F" if rng.random() < p_frozen else "H" for _ in range(size)] for _ in range(size)]
        grid[0][0], grid[-1][-1] = "S", "G"
        desc = ["".join(row) for row in grid]
        if shortest_path(desc, (0, 0)) is not None:
            return desc


def _move(pos: tuple[int, int], action: str, n_rows: int, n_cols: int) -> tuple[int, int]:
    dr, dc = MOVES[action]
    r, c = pos[0] + dr, pos[1] + dc
    return (r, c) if 0 <= r < n_rows and 0 <= c < n_cols else pos


class FrozenLake(Env):
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
    ) -> None:
        if desc is None and map_name not in (*MAPS, "random"):
            raise ValueError(f"map_name={map_name!r} is not one of {sorted(MAPS)} or 'random'")
        if not 2 <= size <= 16:
            raise ValueError(f"size={size} must be between 2 and 16")
        if not 0.0 < p_frozen <= 1.0:
            raise ValueError(f"p_frozen={p_frozen} must be in (0, 1]")
        if max_actions_per_turn < 1:
            raise ValueError("max_actions_per_turn must be >= 1")
        self.map_name, self.size, self.p_frozen = map_name, size, p_frozen
        self.slippery, self.fixed_desc = slippery, desc
        self.max_actions_per_turn, self.show_hints = max_actions_per_turn, show_hints
        self.desc: list[str] = list(desc or MAPS.get(map_name, MAPS["4x4"]))
        self.pos = (0, 0)
        self.done = False
        self._rng = random.Random(0)

    # ---- Env contract ----------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._rng = random.Random(seed)
        if self.fixed_desc is not None:
            self.desc = list(self.fixed_desc)
        elif self.map_name == "random":
            self.desc = random_map(random.Random(seed), self.size, self.p_frozen)
        else:
            self.desc = list(MAPS[self.map_name])
        self.pos = next((r, c) for r, row in enumerate(self.desc) for c, ch in enumerate(row) if ch == "S")
        self.done = False
        return self.render(), {"map": list(self.desc)}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done:
            raise RuntimeError("step() after the episode terminated; call reset()")
        actions = parse_actions(action_text, ACTIONS, self.max_actions_per_turn)
        info: dict[str, Any] = {"actions": actions, "valid": bool(actions), "success": False}
        if not actions:
            info["reward_components"] = {"outcome": 0.0}
            feedback = "Invalid action. Answer with one of: Left, Down, Right, Up.\n"
            return feedback + self.render(), 0.0, False, False, info
        n_rows, n_cols = len(self.desc), len(self.desc[0])
        executed = []
        for action in actions:
            actual = self._rng.choice(_SLIPS[action]) if self.slippery else action
            self.pos = _move(self.pos, actual, n_rows, n_cols)
            executed.append(action)
            if self.cell in "HG":
                break
        success = self.cell == "G"
        self.done = self.cell in "HG"
        info.update(actions=executed, success=success, reward_components={"outcome": 1.0 if success else 0.0})
        return self.render(), 1.0 if success else 0.0, self.done, False, info

    def anchor(self) -> str:
        return "/".join(self.desc) + f"@{self.pos[0]},{self.pos[1]}"

    def solve(self) -> list[str] | None:
        return shortest_path(self.desc, self.pos)

    def examples(self) -> list[tuple[str, str]]:
        out = []
        for desc, pos in _EXAMPLES:
            path = shortest_path(desc, pos)
            assert path, "few-shot example maps must be solvable"
            out.append((self._render(desc, pos), path[0]))
        return out

    def render(self) -> str:
        return self._render(self.desc, self.pos)

    # ---- helpers ---------------------------------------------------------------------------------
    @property
    def cell(self) -> str:
        return self.desc[self.pos[0]][self.pos[1]]

    def _render(self, desc: list[str], pos: tuple[int, int]) -> str:
        rows = ["".join("P" if (r, c) == pos else ch for c, ch in enumerate(row)) for r, row in enumerate(desc)]
        text = "\n".join(rows)
        if self.show_hints:
            n_rows, n_cols = len(desc), len(desc[0])
            parts = []
            for action in ACTIONS:
                nxt = _move(pos, action, n_rows, n_cols)
                parts.append(f"{action}: {'wall' if nxt == pos else _CELL_NAMES[desc[nxt[0]][nxt[1]]]}")
            text += "\n" + ", ".join(parts)
        return text
