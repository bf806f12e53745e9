"""Keys and doors: a colour code seen only at the start is needed many turns later, at the vault door.

The first observation shows the vault's code colour (one of :data:`COLOURS`) and the first room; the code is
never shown again. The agent then walks through ``rooms`` rooms: in each, one passage (``Left`` or ``Right``)
is open and the other blocked, and the observation says which. A blocked choice leaves the agent where it is
(a valid turn with no progress). After the last room it stands at the vault door and must say the code colour:
the right colour terminates with success and outcome reward 1, a wrong one terminates with reward 0.

Every room has a description drawn from :data:`ROOM_TEXT` and ends with the question (``Which passage do you
take, Left or Right?``: without it SmolLM2-135M-Instruct answers a colour in the rooms), so the history grows by
about 55 tokens a turn (SmolLM2's tokenizer, with the chat template): with the default 6 rooms the whole episode
(about 520 tokens with the instructions and examples) exceeds the 448-token budget of ``configs/memory.yaml``,
so a context that drops the oldest turns loses the code before the door unless the agent kept it (``note``,
``compress``: :mod:`turnrl.agent.memory`, whose few-shot notes :meth:`KeysAndDoors.example_note`). A policy
without memory guesses the colour: 1 in ``len(COLOURS)``.

Randomness: ``reset(seed=s)`` draws the code, the open passages and the descriptions from ``random.Random(s)``.
Task key: the code and the open passages (``blue:LRRLRL``): what decides the right actions; the descriptions are
decoration, so two seeds that differ only in them are the same task.
"""

from __future__ import annotations

import random
from typing import Any

from turnrl.envs.base import Env
from turnrl.envs.parsing import parse_actions

DIRECTIONS = ("Left", "Right")
COLOURS = ("red", "green", "blue", "yellow", "white", "black")
ROOM_TEXT = (
    "Dusty shelves line the walls and a lamp flickers above a broken chair.",
    "Water drips from the ceiling into a rusty bucket beside an old crate.",
    "A faded carpet covers the floor and a clock ticks on the far wall.",
    "Cold wind blows through a cracked window over a table of maps.",
    "Stacks of old books lean against a cabinet with an empty birdcage.",
    "A stone statue stands in the corner next to a pile of dry leaves.",
)
EXAMPLE_CODE = "green"  # the code of the few-shot vault (examples)
INVALID_WALK = "Invalid action. Answer Left or Right."
INVALID_DOOR = "Invalid action. Answer with the code colour: " + ", ".join(COLOURS) + "."


class KeysAndDoors(Env):
    """Remember the vault's code colour through ``rooms`` rooms, then say it at the door (see the module docstring).

    Args:
        rooms: how many rooms lie between the start and the vault door (1 to 64).
    """

    instructions = (
        "You walk through rooms to a vault door. The door's code colour is shown only at the start. In each room "
        "answer Left or Right: take the open passage. At the vault door answer the code colour."
    )

    def __init__(self, rooms: int = 6) -> None:
        if not 1 <= rooms <= 64:
            raise ValueError(f"rooms={rooms} must be between 1 and 64")
        self.rooms = rooms
        self.code = COLOURS[0]
        self.open: list[str] = []
        self.texts: list[str] = []
        self.room = 0  # rooms passed; == rooms at the door
        self.done = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """A new vault: the code colour, the open passage and description of each room, all from ``seed``."""
        rng = random.Random(seed)
        self.code = rng.choice(COLOURS)
        self.open = [rng.choice(DIRECTIONS) for _ in range(self.rooms)]
        self.texts = [rng.choice(ROOM_TEXT) for _ in range(self.rooms)]
        self.room, self.done = 0, False
        return f"The vault door's code colour is {self.code}. It will not be shown again.\n{self.render()}", {}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One move (``Left``/``Right``) in a room, or the code colour at the door; text without one is invalid.

        Reward components: ``"outcome"`` (1.0 for the right colour at the door). ``RuntimeError`` after termination.
        """
        if self.done:
            raise RuntimeError("step() after the episode terminated; call reset() first")
        at_door = self.room == self.rooms
        actions = parse_actions(action_text, COLOURS if at_door else DIRECTIONS)
        if not actions:
            info = {"actions": [], "valid": False, "success": False, "reward_components": {"outcome": 0.0}}
            return f"{INVALID_DOOR if at_door else INVALID_WALK}\n{self.render()}", 0.0, False, False, info
        action = actions[0]
        if at_door:
            self.done = True
            success = action == self.code
            verdict = "The door opens." if success else f"Wrong colour: the door stays locked. It was {self.code}."
            info = {"actions": [action], "valid": True, "success": success, "reward_components": {"outcome": float(success)}}
            return verdict, float(success), True, False, info
        blocked = action != self.open[self.room]
        self.room += not blocked
        feedback = "That passage is blocked; you stay.\n" if blocked else ""
        info = {"actions": [action], "valid": True, "success": False, "reward_components": {"outcome": 0.0}}
        return feedback + self.render(), 0.0, False, False, info

    def anchor(self) -> str:
        """``"room <rooms passed>"``: where the agent stands (the task is fixed within a group)."""
        return f"room {self.room}"

    def task_key(self) -> str:
        """``"<code>:<open passages' initials>"``, e.g. ``"blue:LRRLRL"``."""
        return f"{self.code}:{''.join(d[0] for d in self.open)}"

    def solve(self) -> list[str] | None:
        """The open passage of every room left, then the code colour."""
        return None if self.done else [*self.open[self.room :], self.code]

    def examples(self) -> list[tuple[str, str]]:
        """A walk through one room of a fixed vault (code green) and its door: not a task any seed draws."""
        demo = KeysAndDoors(rooms=1)
        demo.code, demo.open, demo.texts = EXAMPLE_CODE, ["Right"], [ROOM_TEXT[0]]
        first = f"The vault door's code colour is {demo.code}. It will not be shown again.\n{demo.render()}"
        demo.room = 1
        return [(first, "Right"), (demo.render(), EXAMPLE_CODE)]

    def example_note(self) -> str:
        """What a memory few-shot notes at the examples' first observation for their last response
        (:meth:`turnrl.agent.memory.MemoryActions.examples`): ``"code green"``."""
        return f"code {EXAMPLE_CODE}"

    def oracle_note(self) -> str:
        """What an oracle keeps in memory for this task (:meth:`turnrl.agent.memory.MemoryActions.solve`):
        ``"code <colour>"``, as :meth:`example_note` is for the examples."""
        return f"code {self.code}"

    def render(self) -> str:
        if self.room == self.rooms:
            return "You stand at the vault door. What is its code colour?"
        open_ = self.open[self.room]
        blocked = DIRECTIONS[1 - DIRECTIONS.index(open_)]
        return (f"Room {self.room + 1} of {self.rooms}. {self.texts[self.room]} The {open_.lower()} passage is open; "
                f"the {blocked.lower()} passage is blocked. Which passage do you take, Left or Right?")
