"""Nim: a two-player competitive game with a text protocol (normal play: whoever takes the last object wins).

Task (seeded): ``heaps`` heaps (default 3) of 1..``max_heap`` objects each (default 4). Roles ``first`` and
``second`` alternate, ``first`` moving first; a move is ``TAKE <count> FROM <heap>`` (heaps numbered from 1),
taking 1..all of one non-empty heap. Both players see the heaps and the opponent's last move.

Reward (component ``"outcome"``): +1 to the player who takes the last object, -1 to the other, paid on that
move (the loser gets it on its last turn); ``success`` is winning. An unparsable or illegal move is invalid
(feedback, the same player moves again); ``forfeit_after`` invalid moves in a row (default 3; 0 = never) forfeit the
game to the opponent, so a player that cannot move legally loses instead of running out the turn limit with no
winner (an untrained model rarely writes a legal move: without it, win rates against it say nothing). The oracle plays Bouton's winning strategy: move to a position whose
nim-sum (XOR of the heaps) is 0; from a zero nim-sum position, where every move loses against perfect play, it
takes one object from the largest heap. :func:`largest_heap_rule` is the best simple fixed rule it is measured
against, and the env's ``rule(role)`` (a scripted self-play opponent that always moves legally). The task key is the
starting heaps.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from functools import reduce
from operator import xor
from typing import Any

from turnrl.envs.multiagent import MultiAgentEnv, MultiStep

FIRST, SECOND = "first", "second"
_MOVE = re.compile(r"TAKE\s+(\d+)\s+FROM\s+(?:HEAP\s+)?(\d+)", re.IGNORECASE)
_RULES = ("Nim: players alternate taking 1 or more objects from one heap; whoever takes the last object wins. "
          "Move with: TAKE <count> FROM <heap>")


class Nim(MultiAgentEnv):
    """Nim (module docstring). ``heaps``: 1..6 heaps; ``max_heap``: the largest starting heap, 1..9;
    ``forfeit_after``: invalid moves in a row that lose the game (0 = never)."""

    roles = (FIRST, SECOND)
    role_instructions = {FIRST: f"You move first. {_RULES}", SECOND: f"You move second. {_RULES}"}

    def __init__(self, heaps: int = 3, max_heap: int = 4, forfeit_after: int = 3) -> None:
        if not (1 <= heaps <= 6 and 1 <= max_heap <= 9 and forfeit_after >= 0):
            raise ValueError(f"heaps={heaps} must be in 1..6, max_heap={max_heap} in 1..9 and forfeit_after={forfeit_after} >= 0")
        self.num_heaps, self.max_heap, self.forfeit_after = heaps, max_heap, forfeit_after
        self.invalid_in_a_row = 0
        self.winner: str | None = None
        self.heaps: list[int] = []
        self.start: tuple[int, ...] = ()
        self.mover = FIRST
        self.last_move = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        rng = random.Random(seed)
        self.heaps = [rng.randint(1, self.max_heap) for _ in range(self.num_heaps)]
        self.start, self.mover, self.last_move = tuple(self.heaps), FIRST, ""
        self.invalid_in_a_row, self.winner = 0, None
        return {r: self._view(r) for r in self.roles}, {}

    def acting(self) -> tuple[str, ...]:
        return (self.mover,) if self.winner is None else ()

    def step(self, actions: Mapping[str, str]) -> MultiStep:
        if set(actions) != set(self.acting()):
            raise ValueError(f"step() got actions of {sorted(actions)}; acting now: {list(self.acting())}")
        mover = self.mover
        move = self._parse(actions[mover])
        other = SECOND if mover == FIRST else FIRST
        if isinstance(move, str):  # why the move is not legal
            self.invalid_in_a_row += 1
            if self.forfeit_after and self.invalid_in_a_row >= self.forfeit_after:
                self.last_move, self.winner = f"{mover} forfeited after {self.invalid_in_a_row} invalid moves in a row.", other
                return self._result({r: self._view(r) for r in self.roles}, [], other, mover)
            return self._result({mover: f"{move} Move with: TAKE <count> FROM <heap>\n{self._view(mover)}"}, [], won=None)
        count, heap = move
        self.heaps[heap - 1] -= count
        self.last_move, self.invalid_in_a_row = f"{mover} took {count} from heap {heap}.", 0
        self.winner = mover if not any(self.heaps) else None
        self.mover = other
        return self._result({r: self._view(r) for r in self.roles}, [f"TAKE {count} FROM {heap}"], self.winner, mover)

    def _parse(self, text: str) -> tuple[int, int] | str:
        found = _MOVE.search(text)
        if found is None:
            return "No move found."
        count, heap = int(found.group(1)), int(found.group(2))
        if not 1 <= heap <= len(self.heaps) or self.heaps[heap - 1] == 0:
            return f"Heap {heap} is not a non-empty heap."
        if not 1 <= count <= self.heaps[heap - 1]:
            return f"You can take 1 to {self.heaps[heap - 1]} from heap {heap}."
        return count, heap

    def _result(self, observations: dict[str, str], actions: list[str], won: str | None, mover: str | None = None) -> MultiStep:
        actor = mover or self.mover
        done = won is not None
        rewards = {r: (1.0 if r == won else -1.0) if done else 0.0 for r in self.roles}
        infos: dict[str, dict[str, Any]] = {r: {"success": r == won, "reward_components": {"outcome": rewards[r]}} for r in self.roles}
        infos[actor].update(actions=actions, valid=bool(actions))
        return MultiStep(observations, rewards, dict.fromkeys(self.roles, done), dict.fromkeys(self.roles, False), infos)

    def _view(self, role: str) -> str:
        heaps = " ".join(f"{i}:{n}" for i, n in enumerate(self.heaps, 1))
        if self.winner is not None:
            return f"{self.last_move} Game over: {'you won' if role == self.winner else 'you lost'}."
        turn = "Your move." if role == self.mover else "Wait for your opponent."
        return f"{self.last_move + ' ' if self.last_move else ''}Heaps: {heaps}. {turn}"

    def anchor(self, role: str) -> str:
        return f"{','.join(map(str, self.heaps))}|{self.mover}"

    def task_key(self) -> str:
        return f"nim:{','.join(map(str, self.start))}"

    def oracle(self, role: str) -> str:
        """Bouton's strategy: make the nim-sum 0 when it is not; else take 1 from the largest heap."""
        total = reduce(xor, self.heaps, 0)
        for i, n in enumerate(self.heaps):
            if total and n ^ total < n:
                return f"TAKE {n - (n ^ total)} FROM {i + 1}"
        return largest_heap_rule(self.heaps)

    def rule(self, role: str) -> str:
        """One object from the largest heap (:func:`largest_heap_rule`): always legal, never aiming at the nim-sum."""
        return largest_heap_rule(self.heaps)

    def examples(self, role: str) -> list[tuple[str, str]]:
        return [("Heaps: 1:3 2:0 3:1. Your move.", "TAKE 2 FROM 1")]

    def render(self) -> str:
        return f"heaps {self.heaps}, {self.mover} to move" + (f"; {self.last_move}" if self.last_move else "")


def largest_heap_rule(heaps: list[int]) -> str:
    """The simple fixed rule: take one object from the largest heap (the first of equal ones)."""
    i = max(range(len(heaps)), key=lambda k: (heaps[k], -k))
    return f"TAKE 1 FROM {i + 1}"
