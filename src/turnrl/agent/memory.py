"""Memory and context actions for any env: ``note: TEXT``, ``recall`` and ``compress: SUMMARY`` (docs/memory.md).

:class:`MemoryActions` wraps an env and answers these actions itself; the env never sees them. A response whose
text starts with an enabled action word is a **memory turn**:

- ``note: TEXT`` appends TEXT to the episode's scratchpad;
- ``recall`` replies with the scratchpad;
- ``compress: SUMMARY`` tells the context that this turn's response replaces every earlier turn (the
  ``budgeted`` context of :mod:`turnrl.agent.context` pins it and forgets the rest; the collector passes
  ``Turn.info["memory"] == "compress"`` on to :meth:`EpisodeContext.advance`).

A memory turn pays reward 0 with ``info["memory"]`` naming the action; it is not an env step, so the env's state,
its turn limit (the inner :class:`~turnrl.envs.wrappers.TurnLimit`), its invalid-action penalty and its episode
statistics are untouched. Its reply is the action's feedback followed by the env's latest observation, so the
policy keeps seeing the task. A note or summary without text is an invalid memory turn (``valid`` False) with
feedback. At most ``max_actions`` memory turns per episode are answered here; past that, the text goes to the env
like any response (which will usually judge it invalid), so an episode stays bounded by ``max_turns +
max_actions`` responses. The tokens of notes and summaries are the agent's response ids: they are trained like any
other response, with the advantage of their turn.
"""

from __future__ import annotations

import re
from typing import Any

from turnrl.envs.base import Env
from turnrl.envs.wrappers import StepResult, Wrapper

ACTIONS = ("note", "recall", "compress")
_USAGE = {
    "note": "note: TEXT (adds TEXT to your notes)",
    "recall": "recall (shows your notes)",
    "compress": "compress: SUMMARY (SUMMARY replaces the earlier turns in your context)",
}


class MemoryActions(Wrapper):
    """Answer the memory actions in ``actions`` (a subset of :data:`ACTIONS`) before the env sees them.

    Args:
        env: the env to wrap (``make``'s result: its wrappers stay inside).
        actions: the enabled action words; the instructions shown to the policy list exactly these.
        max_actions: memory turns answered per episode (>= 1).
    """

    def __init__(self, env: Env, actions: tuple[str, ...] = ACTIONS, max_actions: int = 4) -> None:
        unknown = [a for a in actions if a not in ACTIONS]
        if unknown or not actions:
            raise ValueError(f"memory actions {list(actions)} must be a non-empty subset of {list(ACTIONS)}")
        if max_actions < 1:
            raise ValueError(f"max_actions={max_actions} must be >= 1 (to disable memory actions, do not wrap)")
        super().__init__(env)
        self.actions, self.max_actions = tuple(actions), max_actions
        self._pattern = re.compile(rf"^\s*({'|'.join(self.actions)})\b\s*:?\s*(.*)$", re.IGNORECASE | re.DOTALL)
        self.notes: list[str] = []
        self.used = 0
        self._observation = ""
        self._success = False

    @property
    def instructions(self) -> str:  # type: ignore[override]
        usage = "; ".join(_USAGE[a] for a in self.actions)
        return f"{self.env.instructions} Instead of an action you may answer {usage}."

    def on_reset(self, observation: str, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.notes, self.used, self._observation, self._success = [], 0, observation, False
        return observation, info

    def on_step(self, observation: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> StepResult:
        self._observation, self._success = observation, bool(info.get("success", False))
        return observation, reward, terminated, truncated, info

    def step(self, action_text: str) -> StepResult:
        return self._memory_turn(action_text) or super().step(action_text)

    async def astep(self, action_text: str) -> StepResult:
        return self._memory_turn(action_text) or await super().astep(action_text)

    def _memory_turn(self, text: str) -> StepResult | None:
        """The reply to a memory action in ``text``; None when ``text`` is none (or the episode's are used up)."""
        match = self._pattern.match(text)
        if match is None or self.used >= self.max_actions:
            return None
        self.used += 1
        kind, body = match.group(1).lower(), " ".join(match.group(2).split())
        valid = kind == "recall" or bool(body)
        if not valid:
            feedback = f"Nothing to {kind}: answer {_USAGE[kind]}."
        elif kind == "note":
            self.notes.append(body)
            feedback = f"Noted ({len(self.notes)} notes)."
        elif kind == "recall":
            feedback = "Your notes: " + (" | ".join(self.notes) if self.notes else "none yet") + "."
        else:
            feedback = "Earlier turns replaced by your summary."
        info = {"memory": kind, "actions": [], "valid": valid, "success": self._success, "reward_components": {}}
        return f"{feedback}\n{self._observation}", 0.0, False, False, info
