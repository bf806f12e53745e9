"""Code relay: a cooperative two-agent task with split information that cannot be solved without a message.

Task (seeded): a secret code of ``digits`` decimal digits (default 3). Two roles take turns:

- ``speaker`` sees the code and cannot enter it; its one action is a message, ``SAY <text>``, which the listener
  sees as ``speaker: <text>``.
- ``listener`` never sees the code; it acts after the speaker's message with ``ENTER <digits>``, the first run of
  exactly ``digits`` digits after ``ENTER``. Entering ends the episode for both.

Reward (component ``"outcome"``, paid to both roles): 1.0 when the entered code is the secret, else 0; ``success``
likewise for both. A response without its role's action is invalid (feedback, same role acts again, nothing
changes). Without a message the listener can only guess: any rule that ignores messages succeeds on at most one
of the ``10 ** digits`` codes, a ``10 ** -digits`` chance over tasks (:func:`no_message_rule`).
The task key is the code: there are ``10 ** digits`` distinct tasks.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from turnrl.envs.multiagent import MultiAgentEnv, MultiStep, parse_message

SPEAKER, LISTENER = "speaker", "listener"
_EXAMPLE_CODE = "5081"  # few-shot instance; its length differs from every default task's


class CodeRelay(MultiAgentEnv):
    """The code relay (module docstring). ``digits``: the code's length, 1..8."""

    roles = (SPEAKER, LISTENER)
    role_instructions = {
        SPEAKER: "You are the speaker in a two-player team. You see a secret code; your teammate, the listener, must "
                 "enter it but cannot see it. Tell it the code with one message: SAY <message>",
        LISTENER: "You are the listener in a two-player team. Your teammate, the speaker, sees a secret code you cannot "
                  "see and sends you a message. Enter the code: ENTER <code>",
    }

    def __init__(self, digits: int = 3) -> None:
        if not 1 <= digits <= 8:
            raise ValueError(f"digits={digits} must be in 1..8")
        self.digits = digits
        self.code = ""
        self.message: str | None = None
        self.entered: str | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        rng = random.Random(seed)
        self.code = "".join(str(rng.randrange(10)) for _ in range(self.digits))
        self.message, self.entered = None, None
        return {SPEAKER: self._speaker_view(), LISTENER: self._listener_view()}, {}

    def acting(self) -> tuple[str, ...]:
        if self.entered is not None:
            return ()
        return (SPEAKER,) if self.message is None else (LISTENER,)

    def step(self, actions: Mapping[str, str]) -> MultiStep:
        if set(actions) != set(self.acting()):
            raise ValueError(f"step() got actions of {sorted(actions)}; acting now: {list(self.acting())}")
        role, text = next(iter(actions.items()))
        if role == SPEAKER:
            return self._speak(text)
        return self._enter(text)

    def _speak(self, text: str) -> MultiStep:
        message = parse_message(text)
        if message is None:
            return self._result({SPEAKER: "No message found. Write: SAY <message>\n" + self._speaker_view()}, SPEAKER, [], done=False)
        self.message = message
        return self._result({LISTENER: self._listener_view()}, SPEAKER, [f"SAY {message}"], done=False)

    def _enter(self, text: str) -> MultiStep:
        found = re.search(rf"ENTER\s*(\d{{{self.digits}}})(?!\d)", text, re.IGNORECASE)
        if found is None:
            feedback = f"No code entered. Write: ENTER <{self.digits} digits>\n" + self._listener_view()
            return self._result({LISTENER: feedback}, LISTENER, [], done=False)
        self.entered = found.group(1)
        verdict = "Correct." if self.entered == self.code else f"Wrong: the code was {self.code}."
        return self._result({SPEAKER: verdict, LISTENER: verdict}, LISTENER, [f"ENTER {self.entered}"], done=True)

    def _result(self, observations: dict[str, str], actor: str, actions: list[str], done: bool) -> MultiStep:
        success = self.entered == self.code
        reward = 1.0 if success else 0.0
        infos: dict[str, dict[str, Any]] = {r: {"success": success, "reward_components": {"outcome": reward}} for r in self.roles}
        infos[actor].update(actions=actions, valid=bool(actions))
        return MultiStep(observations, dict.fromkeys(self.roles, reward), dict.fromkeys(self.roles, done),
                         dict.fromkeys(self.roles, False), infos)

    def _speaker_view(self) -> str:
        return f"The secret code is {self.code}."

    def _listener_view(self) -> str:
        if self.message is None:
            return "Wait for the speaker's message."
        return f"{SPEAKER}: {self.message}\nEnter the {self.digits}-digit code: ENTER <code>"

    def anchor(self, role: str) -> str:
        """The speaker's view is the code; the listener's is the message it got (None before one)."""
        return self._speaker_view() if role == SPEAKER else f"message: {self.message}"

    def task_key(self) -> str:
        return f"relay:{self.code}"

    def oracle(self, role: str) -> str:
        """Speaker: ``SAY <code>``. Listener: enter the first ``digits`` digits of the message (only what it saw)."""
        if role == SPEAKER:
            return f"SAY {self.code}"
        heard = re.search(rf"\d{{{self.digits}}}", self.message or "")
        return f"ENTER {heard.group(0) if heard else '0' * self.digits}"

    def examples(self, role: str) -> list[tuple[str, str]]:
        if role == SPEAKER:
            return [(f"The secret code is {_EXAMPLE_CODE}.", f"SAY {_EXAMPLE_CODE}")]
        return [(f"{SPEAKER}: {_EXAMPLE_CODE}\nEnter the {len(_EXAMPLE_CODE)}-digit code: ENTER <code>", f"ENTER {_EXAMPLE_CODE}")]

    def render(self) -> str:
        return f"code {self.code} | message {self.message!r} | entered {self.entered!r}"


def no_message_rule(digits: int = 3) -> str:
    """The best fixed listener rule that ignores messages: always enter the same code (codes are uniform, so every
    fixed guess is as good; this one succeeds only on the all-zero code)."""
    return f"ENTER {'0' * digits}"
