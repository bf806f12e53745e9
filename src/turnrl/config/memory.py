"""The ``memory`` config section: the memory and context actions offered to the policy (``docs/memory.md``).

The context budget itself is a context setting: ``rollout.context=budgeted`` with ``rollout.budget_tokens``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from turnrl.config.section import Section


class MemoryConfig(Section):
    actions: list[Literal["note", "recall", "compress"]] = Field(
        default_factory=list, description="memory actions the agent may answer instead of an env action, answered by "
        "turnrl.agent.memory before the env sees them: 'note: TEXT' (append to a scratchpad), 'recall' (show it), "
        "'compress: SUMMARY' (replaces the earlier turns; needs rollout.context=budgeted); empty = off"
    )
    few_shot: bool = Field(True, description="the few-shot exchanges (with rollout.few_shot) show a memory action in "
                           "use: the env's examples with 'note: FACT' at the first observation and 'recall' before the "
                           "last (turnrl.agent.memory.MemoryActions.examples); false: the env's examples unchanged")
    max_actions: int = Field(4, ge=1, description="memory turns answered per episode; later ones go to the env as "
                                                  "ordinary responses (an episode has at most env.max_turns + this)")

    @field_validator("actions")
    @classmethod
    def _distinct(cls, actions: list[str]) -> list[str]:
        if len(set(actions)) != len(actions):
            raise ValueError(f"memory.actions names an action twice: {actions}")
        return actions
