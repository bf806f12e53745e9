"""Gymnasium's toy-text envs (FrozenLake, Taxi, CliffWalking, Blackjack) as text envs.

The real ``gymnasium`` env runs the dynamics; this adapter renders its state as text, parses action
names from the model's text and maps the step back onto the turnrl contract:

- **Actions by name**, matched case-insensitively as whole words with
  :func:`turnrl.envs.parsing.parse_actions` (the last ``<answer>`` tag, else the whole text); each game
  accepts its action meanings plus compass or screen aliases, e.g. Taxi's ``south``/``down``. One
  action per turn. Text without an action name is invalid: feedback, no step, ``info["valid"] = False``.
- **Reward**: Gymnasium's reward, unchanged, as the component ``"env"`` (Taxi's -1 per move, CliffWalking's
  -100 for the cliff, ...).
- **terminated / truncated**: Gymnasium's. ``gym.make`` keeps each env's registered ``TimeLimit``
  (FrozenLake 100 steps, Taxi 200), which sets ``truncated`` with ``info["truncation"] = "gym_time_limit"``;
  turnrl's ``TurnLimit`` (``max_turns``) normally stops the episode first.
- **success**: FrozenLake: reached the goal; Taxi: delivered the passenger; CliffWalking: reached the goal;
  Blackjack: won the hand (reward > 0).
- **Seeding**: ``reset(seed=s)`` is Gymnasium's ``reset(seed=s)`` (its ``np_random``); ``reset()`` continues
  that generator. With ``random_map=N`` FrozenLake draws a fresh ``N`` x ``N`` map per seed with
  Gymnasium's ``generate_random_map(size=N, seed=s)``.
- **Oracle**: ``solve()`` runs a breadth-first search over the env's transition table ``P`` when every
  transition is deterministic (non-slippery FrozenLake, CliffWalking, Taxi without rain or a fickle
  passenger); it raises ``NotImplementedError`` for stochastic configurations and for Blackjack.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from turnrl.envs.adapters import require
from turnrl.envs.base import Env
from turnrl.envs.parsing import parse_actions
from turnrl.envs.search import shortest_plan

_GOAL = -1  # the oracle's search node for "a success transition was taken"


@dataclass(frozen=True)
class _Game:
    """How one Gymnasium env is shown as text and read back."""

    gym_id: str
    actions: tuple[str, ...]  # canonical names, index = Gymnasium action
    aliases: dict[str, int]  # more accepted words -> action index
    instructions: str
    render: Callable[[Any, Any, float | None], str]  # (unwrapped env, observation, last reward) -> text
    success: Callable[[Any, float, bool], bool]  # (observation, reward, terminated) -> solved?


def _grid_pos(unwrapped: Any, obs: int) -> tuple[int, int]:
    return divmod(int(obs), int(unwrapped.ncol if hasattr(unwrapped, "ncol") else unwrapped.shape[1]))


def _render_frozenlake(unwrapped: Any, obs: int, last_reward: float | None) -> str:
    desc = [[c.decode() for c in row] for row in unwrapped.desc]
    r, c = _grid_pos(unwrapped, obs)
    cell = desc[r][c]
    desc[r][c] = "P"
    lines = [" ".join(row) for row in desc]
    if cell == "G":
        lines.append("You reached the goal.")
    elif cell == "H":
        lines.append("You fell into a hole.")
    return "\n".join(lines)


def _render_cliffwalking(unwrapped: Any, obs: int, last_reward: float | None) -> str:
    rows, cols = unwrapped.shape
    r, c = _grid_pos(unwrapped, obs)
    grid = [["." for _ in range(cols)] for _ in range(rows)]
    for cc in range(1, cols - 1):
        grid[rows - 1][cc] = "C"
    grid[rows - 1][0], grid[rows - 1][cols - 1] = "S", "G"
    grid[r][c] = "P"
    lines = [" ".join(row) for row in grid]
    if last_reward is not None and last_reward <= -100:
        lines.append("You fell off the cliff and are back at the start.")
    if (r, c) == (rows - 1, cols - 1):
        lines.append("You reached the goal.")
    return "\n".join(lines)


def _render_taxi(unwrapped: Any, obs: int, last_reward: float | None) -> str:
    taxi_row, taxi_col, passenger, destination = unwrapped.decode(int(obs))
    desc = [[ch.decode() for ch in row] for row in unwrapped.desc]
    names = [desc[1 + r][2 * c + 1] for r, c in unwrapped.locs]  # R, G, Y, B
    under = desc[1 + taxi_row][2 * taxi_col + 1]
    desc[1 + taxi_row][2 * taxi_col + 1] = "T"
    lines = ["".join(row) for row in desc]
    on = f" (on {under})" if under in names else ""
    where = "in the taxi" if passenger == 4 else f"waiting at {names[passenger]}"
    lines.append(f"Taxi T at row {taxi_row}, column {taxi_col}{on}. Passenger: {where}. Destination: {names[destination]}.")
    if last_reward is not None and last_reward <= -10:
        lines.append("Illegal pickup or dropoff.")
    return "\n".join(lines)


def _render_blackjack(unwrapped: Any, obs: tuple[int, int, int], last_reward: float | None) -> str:
    player_sum, dealer_card, usable_ace = (int(x) for x in obs)
    ace = " with a usable ace" if usable_ace else ""
    if last_reward is None:
        return f"Your hand sums to {player_sum}{ace}. The dealer shows {dealer_card} (1 is an ace)."
    outcome = "You win." if last_reward > 0 else "You lose." if last_reward < 0 else "Draw."
    return (
        f"Your cards: {list(unwrapped.player)} (sum {player_sum}{ace}). "
        f"Dealer's cards: {list(unwrapped.dealer)}. {outcome}"
    )


GAMES: dict[str, _Game] = {
    "frozenlake": _Game(
        "FrozenLake-v1", ("Left", "Down", "Right", "Up"), {"west": 0, "south": 1, "east": 2, "north": 3},
        "You play FrozenLake. Move the player P to the goal G without stepping into a hole H (S is the start, "
        "F frozen ice). Answer with one action: Left, Down, Right or Up.",
        _render_frozenlake, lambda obs, reward, terminated: terminated and reward > 0,
    ),
    "cliffwalking": _Game(
        "CliffWalking-v1", ("Up", "Right", "Down", "Left"), {"north": 0, "east": 1, "south": 2, "west": 3},
        "You play CliffWalking. Move the player P from the start S to the goal G along the grid; stepping on "
        "the cliff C costs -100 and sends you back to S, every move costs -1. Answer with one action: Up, "
        "Right, Down or Left.",
        _render_cliffwalking, lambda obs, reward, terminated: terminated,
    ),
    "taxi": _Game(
        "Taxi-v4", ("South", "North", "East", "West", "Pickup", "Dropoff"),
        {"down": 0, "up": 1, "right": 2, "left": 3, "pick up": 4, "drop off": 5},
        "You drive the taxi T on the map (rows top to bottom, '|' is a wall, ':' is open). Pick up the "
        "passenger at their letter and drop them off at the destination letter. Every move costs -1, an "
        "illegal pickup or dropoff -10, a delivery earns +20. Answer with one action: South, North, East, "
        "West, Pickup or Dropoff.",
        _render_taxi, lambda obs, reward, terminated: terminated,
    ),
    "blackjack": _Game(
        "Blackjack-v1", ("Stick", "Hit"), {"stand": 0, "stay": 0},
        "You play Blackjack against the dealer. Get a hand sum closer to 21 than the dealer without going "
        "over; face cards count 10, an ace 1 or 11. Answer with one action: Hit (take a card) or Stick "
        "(stop and let the dealer play).",
        _render_blackjack, lambda obs, reward, terminated: terminated and reward > 0,
    ),
}


class GymToyText(Env):
    """A Gymnasium toy-text env played in text (see the module docstring).

    Args:
        game: ``"frozenlake"``, ``"taxi"``, ``"cliffwalking"`` or ``"blackjack"``.
        random_map: FrozenLake only: draw an ``N`` x ``N`` map per seed (Gymnasium's ``generate_random_map``)
            instead of the fixed ``map_name`` map.
        **gym_kwargs: passed to ``gymnasium.make`` (e.g. ``is_slippery=False``, ``map_name="8x8"``,
            ``is_rainy=True``, ``natural=True``); Gymnasium rejects keywords the env does not take.
    """

    def __init__(self, game: str = "frozenlake", random_map: int | None = None, **gym_kwargs: Any) -> None:
        if game not in GAMES:
            raise ValueError(f"game={game!r} is not supported; choose one of {sorted(GAMES)}")
        if random_map is not None and (game != "frozenlake" or random_map < 2):
            raise ValueError(f"random_map={random_map} needs game='frozenlake' and a size >= 2")
        if random_map is not None and {"map_name", "desc"} & gym_kwargs.keys():
            raise ValueError("map_name/desc choose a fixed map but random_map draws one per seed; pass random_map=None with them")
        self.gym = require("gymnasium", "gymnasium")
        self.game, self.spec_ = game, GAMES[game]
        self.random_map, self.gym_kwargs = random_map, dict(gym_kwargs)
        self.instructions = self.spec_.instructions  # type: ignore[misc]
        self._vocabulary = {**{name.lower(): i for i, name in enumerate(self.spec_.actions)}, **self.spec_.aliases}
        self._env = self.gym.make(self.spec_.gym_id, **self.gym_kwargs)
        self._obs: Any = None
        self._last_reward: float | None = None
        self._done = False
        self._task_key = ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Gymnasium's ``reset(seed=seed, options=options)``; ``info`` is Gymnasium's info (JSON-able parts)."""
        if self.random_map is not None:
            from gymnasium.envs.toy_text.frozen_lake import generate_random_map

            self._env.close()
            desc = generate_random_map(size=self.random_map, seed=seed)
            self._env = self.gym.make(self.spec_.gym_id, **{**self.gym_kwargs, "desc": desc})
        self._obs, info = self._env.reset(seed=seed, options=options)
        self._last_reward, self._done = None, False
        self._task_key = self.anchor()
        if self.game == "blackjack":  # the dealer's hidden card is part of the hand
            self._task_key += f":{self._env.unwrapped.player}:{self._env.unwrapped.dealer}"
        return self.render(), _plain(info)

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Parse one action name and step the Gymnasium env with it (invalid text: no step, feedback)."""
        if self._done:
            raise RuntimeError("step() after the episode ended; call reset() first")
        words = parse_actions(action_text, list(self._vocabulary), 1)
        if not words:
            names = ", ".join(self.spec_.actions)
            info = {"actions": [], "valid": False, "success": False, "reward_components": {"env": 0.0}}
            return f"Invalid action. Answer with one of: {names}.\n{self.render()}", 0.0, False, False, info
        index = self._vocabulary[words[0].lower()]
        self._obs, reward, terminated, truncated, gym_info = self._env.step(index)
        reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        self._last_reward, self._done = reward, terminated or truncated
        info = {
            "actions": [self.spec_.actions[index]],
            "valid": True,
            "success": bool(self.spec_.success(self._obs, reward, terminated)),
            "reward_components": {"env": reward},
            **{f"gym_{k}": v for k, v in _plain(gym_info).items()},
        }
        if truncated:
            info["truncation"] = "gym_time_limit"
        return self.render(), reward, terminated, truncated, info

    def anchor(self) -> str:
        """``"<game>:<observation>"``: Gymnasium's observation is the full state of these envs (Blackjack: what the
        player sees), plus the map for per-seed FrozenLake maps."""
        key = f"{self.game}:{self._obs!r}"
        if self.random_map is not None:
            key += ":" + "/".join(b"".join(row).decode() for row in self._env.unwrapped.desc)
        return key

    def task_key(self) -> str:
        """The anchor right after reset (the start state, with the map for per-seed FrozenLake maps); Blackjack adds the
        dealt cards, the dealer's hidden one included. Later random draws (cards, slips) are not part of the task."""
        return self._task_key

    def solve(self) -> list[str] | None:
        """Shortest action names from the current state to success, by BFS over the transition table ``P``.

        Raises ``NotImplementedError`` for Blackjack and for stochastic configurations (slippery FrozenLake,
        rainy Taxi, a fickle passenger), where no plan is sure to succeed.
        """
        unwrapped = self._env.unwrapped
        table = getattr(unwrapped, "P", None)
        if table is None or getattr(unwrapped, "fickle_passenger", False) or _stochastic(table):
            raise NotImplementedError(f"{self.game} with {self.gym_kwargs or 'its defaults'} has no deterministic oracle")
        if self._done:
            return [] if self.spec_.success(self._obs, self._last_reward or 0.0, True) else None

        def successors(state: int):
            if state == _GOAL:
                return
            for index, name in enumerate(self.spec_.actions):
                (_, nxt, reward, terminated), = table[state][index]
                if self.spec_.success(nxt, float(reward), bool(terminated)):
                    yield name, _GOAL
                elif not terminated:
                    yield name, int(nxt)

        return shortest_plan(int(self._obs), lambda s: s == _GOAL, successors)

    def render(self) -> str:
        return self.spec_.render(self._env.unwrapped, self._obs, self._last_reward)

    def close(self) -> None:
        self._env.close()


def _stochastic(table: dict[int, dict[int, list[tuple]]]) -> bool:
    return any(len(outcomes) != 1 for actions in table.values() for outcomes in actions.values())


def _plain(info: dict[str, Any]) -> dict[str, Any]:
    """The JSON-able entries of a Gymnasium info dict (numbers, strings, bools); arrays such as Taxi's
    ``action_mask`` become lists."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if hasattr(value, "tolist"):
            value = value.tolist()
        if isinstance(value, (bool, int, float, str, list)):
            out[key] = value
    return out
