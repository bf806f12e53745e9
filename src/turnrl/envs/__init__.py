"""Environments: the contract (``base``), registry (``make``/``register``), wrappers, ``check_env``, built-ins."""

from turnrl.envs.base import Env
from turnrl.envs.checker import EnvCheckError, check_env
from turnrl.envs.registry import UnknownEnvError, make, register, registered, spec
from turnrl.envs.wrappers import EpisodeStatistics, InvalidActionPenalty, OracleProgress, TurnLimit, Wrapper

register(
    "frozenlake-v0",
    "turnrl.envs.frozenlake:FrozenLake",
    description="FrozenLake (Gymnasium semantics), random solvable 4x4 maps by default; slippery, 8x8 and fixed maps optional",
    max_turns=8,
)
register(
    "sokoban-v0",
    "turnrl.envs.sokoban:Sokoban",
    description="Sokoban with seeded procedural puzzles (room size and box count configurable), each solvable",
    max_turns=20,
)

__all__ = [
    "Env", "EnvCheckError", "EpisodeStatistics", "InvalidActionPenalty", "OracleProgress", "TurnLimit",
    "UnknownEnvError", "Wrapper", "check_env", "make", "register", "registered", "spec",
]
