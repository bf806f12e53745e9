"""Environments: the contract (``base``), registry (``make``/``register``), ``wrappers``, ``check_env``, built-ins.

Built-in ids (``turnrl envs`` lists them): ``frozenlake-v0`` and ``sokoban-v0``. Their modules are imported
on the first ``make``.
"""

from turnrl.envs import wrappers
from turnrl.envs.base import Env
from turnrl.envs.checker import EnvCheckError, check_env
from turnrl.envs.registry import UnknownEnvError, make, register, registered, spec
from turnrl.envs.wrappers import EpisodeStatistics, InvalidActionPenalty, OracleProgress, TurnLimit, Wrapper

register(
    "frozenlake-v0",
    "turnrl.envs.frozenlake:FrozenLake",
    description="FrozenLake, Gymnasium semantics; a random solvable 4x4 map per seed (8x8, slippery, fixed maps optional)",
    max_turns=8,
)
register(
    "sokoban-v0",
    "turnrl.envs.sokoban:Sokoban",
    description="Sokoban; a seeded 6x6 room with one box per seed, solvable in 4-10 moves (size, boxes, length configurable)",
    max_turns=20,
)

__all__ = [
    "Env", "EnvCheckError", "EpisodeStatistics", "InvalidActionPenalty", "OracleProgress", "TurnLimit",
    "UnknownEnvError", "Wrapper", "check_env", "make", "register", "registered", "spec", "wrappers",
]
