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

**Doors** (``doors=k >= 2``; ``relay-doors-v0`` is ``doors=3``): the information is split both ways. The speaker sees
``k`` doors of distinct colours, each with its own code, but not which door the team must open; the listener is told
the door's colour but sees no code. One message must therefore carry every door's code with its colour, and the
listener must pick its door's code out of it: the speaker's protocol and the listener's reading both decide the
outcome, which is what per-agent credit has to tell apart. The oracle speaker says ``<colour> <code>`` for every
door; the oracle listener enters the code that follows its colour in the message. A listener that enters the first
code it hears (the simple rule that reads messages) succeeds on the ``1 / k`` of tasks whose door comes first.
The task key is the door colours, their codes and the door to open.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping
from typing import Any

from turnrl.envs.multiagent import MultiAgentEnv, MultiStep, parse_message

SPEAKER, LISTENER = "speaker", "listener"
_EXAMPLE_CODE = "5081"  # few-shot instance; its length differs from every default task's
_DOORS_INSTRUCTIONS = {
    SPEAKER: "You are the speaker in a two-player team. You see the secret codes of several coloured doors, but not which "
             "door the team must open; your teammate, the listener, knows the door but sees no code. Help it with one "
             "message: SAY <message>",
    LISTENER: "You are the listener in a two-player team. You know which coloured door to open; your teammate, the "
              "speaker, sees the doors' codes and sends you a message. Enter your door's code: ENTER <code>",
}
COLOURS = ("red", "blue", "green", "white", "black", "yellow")
_EXAMPLE_DOORS = (("white", "5081"), ("red", "7264"))  # few-shot instance of the doors variant: 4-digit codes


class CodeRelay(MultiAgentEnv):
    """The code relay (module docstring). ``digits``: each code's length, 1..8; ``doors``: 1 (one code) or the number of
    coloured doors, 2..6 (the doors variant)."""

    roles = (SPEAKER, LISTENER)
    role_instructions = {
        SPEAKER: "You are the speaker in a two-player team. You see a secret code; your teammate, the listener, must "
                 "enter it but cannot see it. Tell it the code with one message: SAY <message>",
        LISTENER: "You are the listener in a two-player team. Your teammate, the speaker, sees a secret code you cannot "
                  "see and sends you a message. Enter the code: ENTER <code>",
    }

    def __init__(self, digits: int = 3, doors: int = 1) -> None:
        if not 1 <= digits <= 8:
            raise ValueError(f"digits={digits} must be in 1..8")
        if not 1 <= doors <= len(COLOURS):
            raise ValueError(f"doors={doors} must be in 1..{len(COLOURS)} (1: one code; more: the doors variant)")
        self.digits, self.doors = digits, doors
        if doors > 1:
            self.role_instructions = _DOORS_INSTRUCTIONS  # type: ignore[misc]
        self.door_codes: dict[str, str] = {}  # colour -> code, in the order the speaker sees them (doors variant)
        self.door = ""  # the colour of the door to open (doors variant)
        self.code = ""
        self.message: str | None = None
        self.entered: str | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
        rng = random.Random(seed)
        self.code = "".join(str(rng.randrange(10)) for _ in range(self.digits))
        if self.doors > 1:
            others = ["".join(str(rng.randrange(10)) for _ in range(self.digits)) for _ in range(self.doors - 1)]
            colours = rng.sample(COLOURS, self.doors)
            self.door = rng.choice(colours)
            codes = iter(others)
            self.door_codes = {c: self.code if c == self.door else next(codes) for c in colours}
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
        if self.doors > 1:
            return _doors_view(self.door_codes.items())
        return f"The secret code is {self.code}."

    def _listener_view(self) -> str:
        door = f"Open the {self.door} door. " if self.doors > 1 else ""
        if self.message is None:
            return door + "Wait for the speaker's message."
        return f"{SPEAKER}: {self.message}\n{door}Enter the {self.digits}-digit code: ENTER <code>"

    def anchor(self, role: str) -> str:
        """The speaker's view is the code; the listener's is the message it got (None before one)."""
        return self._speaker_view() if role == SPEAKER else f"message: {self.message}"

    def task_key(self) -> str:
        if self.doors > 1:
            return "relay-doors:" + ",".join(f"{c}={code}" for c, code in self.door_codes.items()) + f":open={self.door}"
        return f"relay:{self.code}"

    def oracle(self, role: str) -> str:
        """Speaker: ``SAY <code>`` (doors: every door's colour and code). Listener: the first ``digits`` digits of the
        message (doors: the ones after its door's colour), only what it saw."""
        if role == SPEAKER:
            return "SAY " + (doors_message(self.door_codes.items()) if self.doors > 1 else self.code)
        after = rf"{self.door}\W*" if self.doors > 1 else ""
        heard = re.search(rf"{after}(\d{{{self.digits}}})", self.message or "", re.IGNORECASE)
        return f"ENTER {heard.group(1) if heard else '0' * self.digits}"

    def examples(self, role: str) -> list[tuple[str, str]]:
        if self.doors > 1:  # the format on a 2-door instance; which door to say and read is left to the policy
            said = doors_message(_EXAMPLE_DOORS)
            if role == SPEAKER:
                return [(_doors_view(_EXAMPLE_DOORS), f"SAY {said}")]
            colour, code = _EXAMPLE_DOORS[1]
            return [(f"{SPEAKER}: {said}\nOpen the {colour} door. Enter the {len(code)}-digit code: ENTER <code>", f"ENTER {code}")]
        if role == SPEAKER:
            return [(f"The secret code is {_EXAMPLE_CODE}.", f"SAY {_EXAMPLE_CODE}")]
        return [(f"{SPEAKER}: {_EXAMPLE_CODE}\nEnter the {len(_EXAMPLE_CODE)}-digit code: ENTER <code>", f"ENTER {_EXAMPLE_CODE}")]

    def render(self) -> str:
        door = f"open {self.door} of {self.door_codes} | " if self.doors > 1 else ""
        return f"{door}code {self.code} | message {self.message!r} | entered {self.entered!r}"


def _doors_view(doors: Iterable[tuple[str, str]]) -> str:
    """The speaker's view of the doors variant: each door's colour and code, not which one to open."""
    listed = ", ".join(f"{c} door {code}" for c, code in doors)
    return f"Door codes: {listed}. Your teammate knows which door to open; you do not."


def doors_message(doors: Iterable[tuple[str, str]]) -> str:
    """The oracle speaker's message in the doors variant: ``<colour> <code>`` for every ``(colour, code)`` door."""
    return " ".join(f"{c} {code}" for c, code in doors)


def no_message_rule(digits: int = 3) -> str:
    """The best fixed listener rule that ignores messages: always enter the same code (codes are uniform, so every
    fixed guess is as good; this one succeeds only on the all-zero code)."""
    return f"ENTER {'0' * digits}"
