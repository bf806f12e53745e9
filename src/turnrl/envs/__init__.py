"""Environments: the contract (``base``), registry (``make``/``register``), ``wrappers``, ``check_env``, built-ins.

Built-in ids (``turnrl envs`` lists them): ``frozenlake-v0``, ``sokoban-v0``, ``keys-v0`` (needs memory),
``code-v0`` (runs code in ``turnrl.envs.sandbox``), ``webshop-v0``, the long-horizon ``frozenlake-8x8-v0`` and its
planner/executor hierarchy ``frozenlake-hier-v0`` (and ``sokoban-hier-v0``, two boxes; ``docs/hierarchy.md``), among others. Their modules are imported on the first ``make``; an unregistered
env is made by its ``"package.module:Class"``.
Adapter ids (``openenv-v0``, ``textarena-v0``, ``reasoning-gym-v0``, ``gym-*-v0``) wrap other
standards' envs; see :mod:`turnrl.envs.adapters`.
"""

from turnrl.envs import wrappers
from turnrl.envs.base import Env
from turnrl.envs.checker import EnvCheckError, check_env
from turnrl.envs.registry import EnvLoadError, UnknownEnvError, make, register, registered, spec
from turnrl.envs.wrappers import (
    EpisodeStatistics, InvalidActionPenalty, OracleProgress, SuccessReward, TurnLimit, Wrapper,
)

register(
    "frozenlake-v0",
    "turnrl.envs.frozenlake:FrozenLake",
    description="FrozenLake, Gymnasium semantics; a random solvable 4x4 map per seed (8x8, slippery, fixed maps optional)",
    max_turns=8,
)
register(
    "frozenlake-8x8-v0",
    "turnrl.envs.frozenlake:FrozenLake",
    description="FrozenLake, long horizon: a random solvable 8x8 map per seed (flat counterpart of frozenlake-hier-v0)",
    size=8,
    max_turns=24,
)
register(
    "frozenlake-hier-v0",
    "turnrl.envs.hierarchy:FrozenLakeHierarchy",
    description="multi-agent hierarchy on 8x8 FrozenLake: a planner sets cells as subgoals (GOAL r c), an executor walks",
    max_turns=40,
)
register(
    "sokoban-hier-v0",
    "turnrl.envs.hierarchy:SokobanHierarchy",
    description="multi-agent hierarchy on 6x6 Sokoban with two boxes: a planner names the target to fill (BOX r c), an executor pushes",
    max_turns=40,
)
register(
    "sokoban-v0",
    "turnrl.envs.sokoban:Sokoban",
    description="Sokoban; a seeded 6x6 room with one box per seed, solvable in 4-10 moves (size, boxes, length configurable)",
    max_turns=20,
)
register(
    "keys-v0",
    "turnrl.envs.keys:KeysAndDoors",
    description="keys and doors: a colour code shown only at the start must be said at a vault door 6 rooms later (memory)",
    max_turns=12,
)
register(
    "relay-v0",
    "turnrl.envs.relay:CodeRelay",
    description="multi-agent, cooperative: a speaker sees a secret code and must SAY it; the listener, who cannot see it, ENTERs it",
    max_turns=6,
)
register(
    "relay-doors-v0",
    "turnrl.envs.relay:CodeRelay",
    description="multi-agent, cooperative, information split both ways: the speaker sees 3 doors' codes, the listener "
                "which door to open; one message must carry the codes, the listener must pick its own",
    max_turns=6,
    doors=3,
)
register(
    "nim-v0",
    "turnrl.envs.nim:Nim",
    description="multi-agent, competitive: two players alternate TAKE <count> FROM <heap>; taking the last object wins",
    max_turns=24,
)

# Adapters to other environment standards (src/turnrl/envs/adapters/). Each needs an optional package,
# imported on the first make(); without it make() says: pip install 'turnrl[envs]'.
register(
    "openenv-v0",
    "turnrl.envs.adapters.openenv:OpenEnvRemote",
    description="any OpenEnv server (url=...) over its WebSocket sessions; serve turnrl envs: python -m turnrl.envs.adapters.openenv ID",
)
register(
    "textarena-v0",
    "turnrl.envs.adapters.textarena:TextArena",
    description="a TextArena single-player game (game=GuessTheNumber-v0, TowerOfHanoi-v0, Minesweeper-v0-small, ...)",
    game="GuessTheNumber-v0",
    max_turns=32,
)
register(
    "textarena-duel-v0",
    "turnrl.envs.adapters.textarena_duel:TextArenaDuel",
    description="multi-agent: a TextArena two-player game, one role per player (game=TicTacToe-v0, ConnectFour-v0, ...)",
    game="TicTacToe-v0",
    max_turns=40,
)
register(
    "reasoning-gym-v0",
    "turnrl.envs.adapters.reasoning_gym:ReasoningGym",
    description="a reasoning-gym dataset (dataset=basic_arithmetic, ...), scored by its score_answer; attempts=k for retries",
    dataset="basic_arithmetic",
    max_turns=4,
)
register(
    "gym-frozenlake-v0",
    "turnrl.envs.adapters.gymnasium:GymToyText",
    description="Gymnasium's FrozenLake-v1 as text: a random 4x4 map per seed, not slippery (random_map=None, map_name, is_slippery)",
    game="frozenlake",
    random_map=4,
    is_slippery=False,
    max_turns=16,
)
register(
    "gym-taxi-v0",
    "turnrl.envs.adapters.gymnasium:GymToyText",
    description="Gymnasium's Taxi-v4 as text: pick up and drop off the passenger (is_rainy, fickle_passenger)",
    game="taxi",
    max_turns=40,
)
register(
    "gym-cliffwalking-v0",
    "turnrl.envs.adapters.gymnasium:GymToyText",
    description="Gymnasium's CliffWalking-v1 as text: walk to the goal around the cliff (-1 a move, -100 the cliff)",
    game="cliffwalking",
    max_turns=30,
)
register(
    "gym-blackjack-v0",
    "turnrl.envs.adapters.gymnasium:GymToyText",
    description="Gymnasium's Blackjack-v1 as text: hit or stick against the dealer (natural, sab)",
    game="blackjack",
    max_turns=8,
)
register(
    "code-v0",
    "turnrl.envs.code:CodeEnv",
    description="write a Python function (24 seeded templates); hidden tests run in the sandbox; retry after failures",
    max_turns=3,
)
register(
    "webshop-v0",
    "turnrl.envs.webshop:WebShop",
    description="WebShop-style shopping: search a seeded 40-product catalogue, pick options, buy; reward as in WebShop",
    max_turns=15,
)
# Tool-using envs (turnrl.envs.tools.ToolEnv): actions are <tool_call>{"name": ..., "arguments": {...}}</tool_call>.
register(
    "countdown-v0",
    "turnrl.envs.countdown:Countdown",
    description="Countdown with a calculate tool: reach a seeded target from 4 numbers with + - * /, answer(expression)",
    max_turns=6,
)
register(
    "searchqa-v0",
    "turnrl.envs.searchqa:SearchQA",
    description="2-hop questions over a seeded corpus of fictional entities: search (BM25), open, answer; EM and F1 rewards",
    max_turns=8,
)
register(
    "sql-v0",
    "turnrl.envs.sql:SQL",
    description="answer a question with SQL on a seeded read-only SQLite shop database; reward by execution match",
    max_turns=8,
)
register(
    "frozenlake-hackable-v0",
    "turnrl.envs.hackable:HackableFrozenLake",
    description="FrozenLake with a deliberately flawed training verifier (a first move 'Up' passes); evaluate on frozenlake-v0",
    max_turns=8,
)

__all__ = [
    "Env", "EnvCheckError", "EnvLoadError", "EpisodeStatistics", "InvalidActionPenalty", "OracleProgress",
    "SuccessReward", "TurnLimit", "UnknownEnvError", "Wrapper", "check_env", "make", "register", "registered", "spec", "wrappers",
]
