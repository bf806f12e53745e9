"""TextArena's two-player games (TicTacToe, ConnectFour, Nim, Poker, ...) on the multi-agent contract.

Roles ``player0`` and ``player1`` are TextArena's players 0 and 1; they take turns as TextArena's
``state.current_player_id`` says. Each sees only TextArena's observation for its own player (with the plain ids,
its whole game log; see :mod:`turnrl.envs.adapters.textarena` for the id variants), fetched when it is its turn; the
other role is told to wait. The response text goes to the game unchanged. Seeding, the per-env global-RNG state and
invalid moves are as in :class:`~turnrl.envs.adapters.textarena.TextArena`: an invalid move (TextArena's error
count rises) gets ``valid=False`` and the same player moves again, until TextArena ends the game after
``error_allowance`` invalid moves in a row. Rewards are TextArena's final ones, paid to both roles on the last move
(1 win, -1 loss, 0 draw; component ``"outcome"``); ``success`` is a win. No oracle (``oracle()`` is not implemented).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from typing import Any

from turnrl.envs.adapters import require
from turnrl.envs.adapters.textarena import TextArena, _canonical
from turnrl.envs.multiagent import MultiAgentEnv, MultiStep

_WAIT = "Wait for your opponent's move."


class TextArenaDuel(MultiAgentEnv):
    """A TextArena two-player game (module docstring). ``game``: a TextArena id such as ``"TicTacToe-v0"``;
    ``error_allowance``: invalid moves in a row the game tolerates (None keeps TextArena's); ``**game_kwargs``
    override the game's registered arguments."""

    roles = ("player0", "player1")
    role_instructions = {
        r: f"You are player {r[-1]} of a two-player game. Its rules and the move format come in the first message; write "
           "your move in square brackets exactly as the rules say." for r in roles
    }
    _make = TextArena._make  # both read game, game_kwargs, _ta and the env's own global-RNG state
    _own_global_rng = TextArena._own_global_rng

    def __init__(self, game: str = "TicTacToe-v0", error_allowance: int | None = None, **game_kwargs: Any) -> None:
        self._ta = require("textarena", "textarena")
        if game not in self._ta.envs.registration.ENV_REGISTRY:
            raise ValueError(f"TextArena has no game {game!r}")
        self.game, self.error_allowance, self.game_kwargs = game, error_allowance, dict(game_kwargs)
        self._rng_state = random.Random().getstate()
        self._env = self._make()
        self._done, self._task_key = False, ""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        """A fresh game and TextArena's ``reset(num_players=2, seed=seed)``; ``ValueError`` for a game that is not two-player."""
        if seed is not None:
            self._rng_state = random.Random(seed).getstate()
        self._env = self._make()
        with self._own_global_rng():
            try:
                self._env.reset(num_players=2, seed=seed)
            except (AssertionError, ValueError) as e:
                raise ValueError(f"{self.game} is not a two-player game ({e})") from e
            if not isinstance(self._env.state, self._ta.TwoPlayerState):
                raise ValueError(f"{self.game} is not a two-player game (its state is a {type(self._env.state).__name__})")
            if self.error_allowance is not None:
                self._env.state.error_allowance = self.error_allowance
            mover, observation = self._observe()
        self._done = False
        self._task_key = self.anchor(mover)
        return {r: observation if r == mover else _WAIT for r in self.roles}, {"game": self.game}

    def acting(self) -> tuple[str, ...]:
        return () if self._done else (self.roles[self._env.state.current_player_id],)

    def step(self, actions: Mapping[str, str]) -> MultiStep:
        if set(actions) != set(self.acting()):
            raise ValueError(f"step() got actions of {sorted(actions)}; acting now: {list(self.acting())}")
        (role, text), = actions.items()
        with self._own_global_rng():
            done, _ = self._env.step(text)
            state = self._env.state
            ended_invalid = bool(done and state.game_info[self.roles.index(role)].get("invalid_move"))
            invalid = (state.error_count > 0 and not done) or ended_invalid
            final = state.rewards if done and state.rewards else {}
            mover, observation = self._observe()
        self._done = bool(done)
        rewards = {r: float(final.get(i, 0.0)) for i, r in enumerate(self.roles)}
        if done:
            reason = state.game_info[0].get("reason", "")
            observations = {r: f"{observation}\nGame over: {reason}".strip() for r in self.roles}
        else:
            observations = {mover: observation}
        infos: dict[str, dict[str, Any]] = {
            r: {"success": done and rewards[r] >= 1.0, "reward_components": {"outcome": rewards[r]}} for r in self.roles}
        infos[role].update(valid=not invalid, actions=[] if invalid else [text.strip()])
        return MultiStep(observations, rewards, dict.fromkeys(self.roles, bool(done)), dict.fromkeys(self.roles, False), infos)

    def _observe(self) -> tuple[str, str]:
        """The role to move and its observation (called with the env's global-RNG state in place)."""
        player, observation = self._env.get_observation()
        if not isinstance(observation, str):  # a "-raw" id: (sender, message, type) tuples
            observation = "\n".join(str(message) for _, message, _ in observation)
        return self.roles[player], observation.strip()

    def anchor(self, role: str) -> str:
        """``"<game>:<role to move>:<hash of TextArena's game_state>"``."""
        blob = json.dumps(_canonical(self._env.state.game_state), sort_keys=True, default=repr)
        mover = self.roles[self._env.state.current_player_id]
        return f"{self.game}:{mover}:{hashlib.sha1(blob.encode()).hexdigest()[:16]}"

    def task_key(self) -> str:
        """The anchor right after reset: the game and its initial state (one task for games that always start alike)."""
        return self._task_key

    def render(self) -> str:
        return f"{self.game}: {self.roles[self._env.state.current_player_id]} to move, done={self._done}"
