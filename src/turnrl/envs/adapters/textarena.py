"""TextArena's single-player games (GuessTheNumber, TowerOfHanoi, Minesweeper, Mastermind, ...) as turnrl envs.

``textarena.make(game)`` builds the game with TextArena's own wrappers for that id: the plain ids
(``"GuessTheNumber-v0"``) show the whole game log so far in every observation (``LLMObservationWrapper``),
so each observation is self-contained; ``"-train"`` ids show the prompt, the game messages and the current
board; ``"-raw"`` ids give message lists, which this adapter joins as ``[GAME] ...`` lines.

- **Actions**: the response text goes to the game unchanged (TextArena's ``ActionFormattingWrapper`` puts
  text without brackets in brackets). ``info["actions"]`` lists the bracketed parts the game received.
- **Invalid moves** are TextArena's: the game answers with "You attempted an invalid move..." and keeps
  its state, ``info["valid"] = False``. TextArena ends the game when ``error_allowance`` invalid moves come
  in a row (default: its own 1, so the second consecutive invalid move loses); that last step is
  terminated with ``valid = False`` and the game's penalty reward.
- **Reward**: TextArena pays only when the game ends: 1 for a win, partial credit in [0, 1) for most losses
  (the game's completion measure), the game's penalty for an invalid loss. It is the component
  ``"outcome"``. **success**: the game ended with reward >= 1 and not on an invalid move (TextArena's
  convention for a win). Where a game's final reward is not a number (a TextArena bug in Countdown,
  Cryptarithm, Slitherlink and ThreeCardMonte 0.7.4: swapped arguments make it a message string), the
  adapter pays 0.0 and keeps the string in ``info["textarena_reward"]``.
- **Seeding**: TextArena seeds and draws from Python's *global* ``random`` (``State.__init__`` calls
  ``random.seed(seed)``). This adapter gives each env its own global-RNG state: every call into the game
  swaps the env's state in and the caller's back out (under a lock), so an episode is a function of its
  seed and its actions whatever other code or envs do with ``random`` in between, and the caller's global
  RNG is left as it was. ``reset()`` without a seed continues the env's stream. (Another *thread* that uses
  ``random`` while a game call runs would still interleave with it; the lock only orders the adapters.)
- **No oracle**: ``solve()`` is not implemented (``check_env`` then plays garbage text, and progress
  shaping is unavailable).

Games that need NLTK corpora (Wordle, Hangman, SpellingBee, ...) download them on first import; offline
that fails, and the error says which ``nltk.downloader`` command installs them.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from turnrl.envs.adapters import require
from turnrl.envs.base import Env

_GLOBAL_RNG = threading.Lock()  # one swap of the global random state at a time
_BRACKETS = re.compile(r"\[[^\[\]]*\]")


class TextArena(Env):
    """A TextArena single-player game (see the module docstring).

    Args:
        game: a TextArena env id, e.g. ``"GuessTheNumber-v0"``, ``"TowerOfHanoi-v0"``,
            ``"Minesweeper-v0-small"``, ``"Mastermind-v0-train"``.
        error_allowance: invalid moves in a row the game tolerates before it ends; None keeps TextArena's.
        instructions: the system prompt; by default a short note that the rules come in the first observation.
        **game_kwargs: overrides of the game's registered arguments (e.g. ``max_number=50``).
    """

    def __init__(self, game: str = "GuessTheNumber-v0", error_allowance: int | None = None,
                 instructions: str | None = None, **game_kwargs: Any) -> None:
        ta = require("textarena", "textarena")
        if game not in ta.envs.registration.ENV_REGISTRY:
            import difflib

            close = difflib.get_close_matches(game, list(ta.envs.registration.ENV_REGISTRY), n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ValueError(f"TextArena has no game {game!r}.{hint}")
        if error_allowance is not None and error_allowance < 0:
            raise ValueError(f"error_allowance={error_allowance} must be >= 0")
        self.game, self.error_allowance = game, error_allowance
        self._ta = ta
        self._rng_state = random.Random().getstate()  # this env's own global-RNG stream
        self.game_kwargs = dict(game_kwargs)
        self._env = self._make()
        self.instructions = instructions if instructions is not None else (  # type: ignore[misc]
            f"You play the game {game.split('-v')[0]}. Its rules and the move format come in the first message; "
            "write your move in square brackets exactly as the rules say."
        )
        self._observation = self._task_key = ""
        self._done = False

    def _make(self) -> Any:
        """A fresh game from ``textarena.make`` (its observation wrappers keep the log across resets otherwise)."""
        with self._own_global_rng():
            try:
                return self._ta.make(self.game, **self.game_kwargs)
            except LookupError as e:  # an NLTK corpus the game loads is missing (no internet to fetch it)
                raise RuntimeError(
                    f"TextArena's {self.game} needs NLTK data that is not installed: {str(e).strip().splitlines()[0]}. "
                    "Download it once with: python -m nltk.downloader words averaged_perceptron_tagger_eng"
                ) from e

    @contextmanager
    def _own_global_rng(self) -> Iterator[None]:
        """Run the block with this env's global-RNG state, then put the caller's back."""
        with _GLOBAL_RNG:
            outer = random.getstate()
            random.setstate(self._rng_state)
            try:
                yield
            finally:
                self._rng_state = random.getstate()
                random.setstate(outer)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """A fresh game, then TextArena's ``reset(num_players=1, seed=seed)``; ``ValueError`` for a multi-player game.

        With a seed, the env's global-RNG state restarts from ``seed`` before the game is built, so games that
        draw in their constructor (Countdown's numbers) depend on the seed too.
        """
        if seed is not None:
            self._rng_state = random.Random(seed).getstate()
        self._env = self._make()
        with self._own_global_rng():
            try:
                self._env.reset(num_players=1, seed=seed)
            except (AssertionError, ValueError) as e:  # the game refuses one player
                raise ValueError(f"{self.game} is not a single-player game ({e}); only single-player games are supported") from e
            if not isinstance(self._env.state, self._ta.SinglePlayerState):  # some accept one player silently
                raise ValueError(
                    f"{self.game} is not a single-player game (its state is a {type(self._env.state).__name__}); "
                    "only single-player games are supported"
                )
            if self.error_allowance is not None:
                self._env.state.error_allowance = self.error_allowance
            self._observation = self._read_observation()
        self._done = False
        self._task_key = self.anchor()
        return self._observation, {"game": self.game}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Send the text to the game (see the module docstring for validity, reward and success)."""
        if self._done:
            raise RuntimeError("step() after the game ended; call reset() first")
        with self._own_global_rng():
            done, _ = self._env.step(action_text)
            state = self._env.state
            game_info = state.game_info[0]
            invalid = state.error_count > 0 or bool(done and game_info.get("invalid_move"))
            final = state.rewards[0] if done and state.rewards else 0.0
            observation = self._read_observation()
        # A few games (Countdown, Cryptarithm, Slitherlink, ThreeCardMonte in textarena 0.7.4) pass their
        # arguments to set_invalid_move swapped, which makes the final reward a message string.
        reward = float(final) if isinstance(final, (int, float)) else 0.0
        self._done = bool(done)
        if done and game_info.get("reason"):
            observation += f"\nGame over: {game_info['reason']}"
        self._observation = observation
        sent = action_text if _BRACKETS.search(action_text) else f"[{action_text}]"
        info = {
            "actions": [] if invalid else _BRACKETS.findall(sent),
            "valid": not invalid,
            "success": bool(done) and reward >= 1.0 and not invalid,
            "reward_components": {"outcome": reward},
        }
        if done and game_info.get("reason"):
            info["reason"] = str(game_info["reason"])
        if not isinstance(final, (int, float)):
            info["textarena_reward"] = str(final)
        return observation, reward, bool(done), False, info

    def anchor(self) -> str:
        """``"<game>:<hash of the game state>"``: TextArena's ``state.game_state`` (board, secret, history)."""
        blob = json.dumps(_canonical(self._env.state.game_state), sort_keys=True, default=repr)
        return f"{self.game}:{hashlib.sha1(blob.encode()).hexdigest()[:16]}"

    def task_key(self) -> str:
        """The anchor right after reset: the game and a hash of its initial state, hidden parts included (the secret
        number of GuessTheNumber, whose observation is the same for every seed)."""
        return self._task_key

    def render(self) -> str:
        return self._observation

    def close(self) -> None:
        pass  # TextArena's close() only reports the final rewards; there is nothing to release

    def _read_observation(self) -> str:
        _, observation = self._env.get_observation()
        if not isinstance(observation, str):  # a "-raw" id: (sender, message, type) tuples
            observation = "\n".join(
                f"[{'GAME' if sender == self._ta.GAME_ID else 'Player'}] {message}" for sender, message, _ in observation
            )
        return observation.strip()


def _canonical(value: Any) -> Any:
    """``value`` with sets sorted and tuples as lists, so its JSON text does not depend on hashing order."""
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=repr)
    return value
