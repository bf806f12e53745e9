"""Breadth-first search for oracle plans, shared by the built-in envs' ``solve()``."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

S = TypeVar("S", bound=Hashable)


def shortest_plan(
    start: S,
    is_goal: Callable[[S], bool],
    successors: Callable[[S], Iterable[tuple[str, S]]],
    max_states: int | None = None,
) -> list[str] | None:
    """Shortest list of actions from ``start`` to a goal state, or None if none is found.

    ``successors(state)`` yields ``(action, next_state)`` in the order ties should break; a state whose
    successors are empty is a dead end. The search gives up (None) after visiting ``max_states`` states.
    """
    parent: dict[S, tuple[S, str] | None] = {start: None}
    queue = deque([start])
    while queue and (max_states is None or len(parent) <= max_states):
        state = queue.popleft()
        if is_goal(state):
            path: list[str] = []
            link = parent[state]
            while link is not None:
                state, action = link
                path.append(action)
                link = parent[state]
            return path[::-1]
        for action, nxt in successors(state):
            if nxt not in parent:
                parent[nxt] = (state, action)
                queue.append(nxt)
    return None
