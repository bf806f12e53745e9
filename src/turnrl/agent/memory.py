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

The few-shot exchanges (:meth:`MemoryActions.examples`) show a memory action in use, in the env's own exchanges and
with the replies this wrapper gives: a model that has never seen ``note:`` in a prompt does not write it. The oracle
(:meth:`MemoryActions.solve`) uses them the same way, so demonstrations (``turnrl sft``, ``sft.demos=oracle``) teach
the policy to keep what it will need, where the env says what that is (``oracle_note()``).
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


BUDGET_LINE = ("Each observation ends with [context: L of B tokens left]: past B tokens your oldest turns are "
               "dropped from your context.")


def _answer(kind: str, body: str, notes: list[str]) -> tuple[str, bool]:
    """The feedback to the memory action ``kind`` with text ``body``, and whether it was valid; a note joins ``notes``."""
    if kind != "recall" and not body:
        return f"Nothing to {kind}: answer {_USAGE[kind]}.", False
    if kind == "note":
        notes.append(body)
        return f"Noted ({len(notes)} notes).", True
    if kind == "recall":
        return "Your notes: " + (" | ".join(notes) if notes else "none yet") + ".", True
    return "Earlier turns replaced by your summary.", True


class MemoryActions(Wrapper):
    """Answer the memory actions in ``actions`` (a subset of :data:`ACTIONS`) before the env sees them.

    Args:
        env: the env to wrap (``make``'s result: its wrappers stay inside).
        actions: the enabled action words; the instructions shown to the policy list exactly these.
        max_actions: memory turns answered per episode (>= 1).
        budgeted: the policy's context is ``budgeted``: the instructions also say what its budget line means.
        few_shot: the few-shot exchanges show a memory action in use (:meth:`examples`); False: the env's own.
    """

    def __init__(self, env: Env, actions: tuple[str, ...] = ACTIONS, max_actions: int = 4, budgeted: bool = False,
                 few_shot: bool = True) -> None:
        unknown = [a for a in actions if a not in ACTIONS]
        if unknown or not actions:
            raise ValueError(f"memory actions {list(actions)} must be a non-empty subset of {list(ACTIONS)}")
        if max_actions < 1:
            raise ValueError(f"max_actions={max_actions} must be >= 1 (to disable memory actions, do not wrap)")
        super().__init__(env)
        self.actions, self.max_actions, self.budgeted, self.few_shot = tuple(actions), max_actions, budgeted, few_shot
        self._pattern = re.compile(rf"^\s*({'|'.join(self.actions)})\b\s*:?\s*(.*)$", re.IGNORECASE | re.DOTALL)
        self.notes: list[str] = []
        self.used = 0
        self._observation = ""
        self._success = False
        self._answered: set[str] = set()  # the memory actions answered (validly) this episode, for solve()

    @property
    def instructions(self) -> str:  # type: ignore[override]
        usage = "; ".join(_USAGE[a] for a in self.actions)
        budget = f" {BUDGET_LINE}" if self.budgeted else ""
        return f"{self.env.instructions} Instead of an action you may answer {usage}.{budget}"

    def examples(self) -> list[tuple[str, str]]:
        """The env's few-shot exchanges with a memory action shown in use, each reply as this wrapper gives it.

        The first observation is answered ``note: FACT`` (``compress: FACT`` when note is off), its reply (the
        feedback, then the same observation) with the env's own response. FACT is the env's ``example_note()`` when it
        has one: then its examples are one episode whose last response needs FACT, and (with recall on) the last
        observation is first answered ``recall``. Without it FACT is the first observation's first line (at most 12
        words) and nothing is recalled, since an env's examples may be separate tasks. Unchanged when ``few_shot`` is
        off or neither note nor compress is on.
        """
        pairs = list(self.env.examples())
        keep = next((a for a in ("note", "compress") if a in self.actions), None)
        if not pairs or keep is None or not self.few_shot:
            return pairs
        hint = getattr(self.env, "example_note", None)
        fact = hint() if hint else " ".join(pairs[0][0].strip().split("\n")[0].split()[:12])
        if not fact:
            return pairs
        memory_turns: dict[int, list[str]] = {0: [f"{keep}: {fact}"]}
        if hint and keep == "note" and "recall" in self.actions:
            memory_turns.setdefault(len(pairs) - 1, []).append("recall")
        notes: list[str] = []
        shown = []
        for i, (observation, response) in enumerate(pairs):
            for action in memory_turns.get(i, []):
                kind, body = self._parse(action)
                shown.append((observation, action))
                observation = f"{_answer(kind, body, notes)[0]}\n{observation}"
            shown.append((observation, response))
        return shown

    def solve(self) -> list[str] | None:
        """The env's plan from here with this wrapper's memory actions in it, as :meth:`examples` shows them in use.

        When the env says what to keep (``oracle_note()``, e.g. keys-v0's ``"code blue"``) and note or compress is on:
        first ``note: FACT`` (``compress: FACT`` when note is off); with note and recall on, ``recall`` just before
        the plan's last action (the one that needs FACT). Otherwise, or once ``max_actions`` memory turns are used,
        the env's plan unchanged. Demonstrations of it (``sft.demos=oracle``) are what teaches a model that never
        writes a memory action (bench/results/memory_base.json) to keep a fact through a budgeted context.
        """
        plan = self.env.solve()
        hint = getattr(self.env, "oracle_note", None)
        keep = next((a for a in ("note", "compress") if a in self.actions), None)
        if not plan or hint is None or keep is None or self.used >= self.max_actions:
            return plan
        if keep not in self._answered:
            return [f"{keep}: {hint()}", *plan]
        if keep == "note" and "recall" in self.actions and len(plan) == 1 and "recall" not in self._answered:
            return ["recall", *plan]
        return plan

    def on_reset(self, observation: str, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self.notes, self.used, self._observation, self._success = [], 0, observation, False
        self._answered = set()
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
        parsed = self._parse(text)
        if parsed is None or self.used >= self.max_actions:
            return None
        self.used += 1
        kind, body = parsed
        feedback, valid = _answer(kind, body, self.notes)
        if valid:
            self._answered.add(kind)
        info = {"memory": kind, "actions": [], "valid": valid, "success": self._success, "reward_components": {}}
        return f"{feedback}\n{self._observation}", 0.0, False, False, info

    def _parse(self, text: str) -> tuple[str, str] | None:
        """``(action word, its text with whitespace collapsed)`` when ``text`` starts with an enabled action, else None."""
        match = self._pattern.match(text)
        return None if match is None else (match.group(1).lower(), " ".join(match.group(2).split()))
