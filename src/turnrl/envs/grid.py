"""Positions on the built-in grid envs (FrozenLake, Sokoban): distances, and offsets said in words for hint lines."""

from __future__ import annotations

Pos = tuple[int, int]  # (row, column)


def manhattan(a: Pos, b: Pos) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def offsets(p: Pos, origin: Pos) -> list[tuple[int, str]]:
    """``[(2, "down"), (1, "left")]``: the nonzero row then column distances from ``origin`` to ``p``, with their words."""
    dr, dc = p[0] - origin[0], p[1] - origin[1]
    return [(abs(d), word) for d, word in ((dr, "down" if dr > 0 else "up"), (dc, "right" if dc > 0 else "left")) if d]
