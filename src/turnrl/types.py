"""Typed records that flow through turnrl. No behaviour lives here beyond small derived views.

Terms follow DESIGN.md:

- a **turn** is one model response and the environment's reply to it;
- **terminated** means the env reached a terminal state (goal, failure); **truncated** means a limit
  stopped the episode (turns, tokens, context). A critic bootstraps on truncation only;
- the **outcome reward** is what the env's verifier pays at the end; **step rewards** are paid per
  turn; format / invalid-action penalties are separate named components;
- a **group** is copies of one task (same seed) rolled out under the same policy;
- **behaviour logprobs** are the logprobs the engine sampled with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Termination(str, Enum):
    """Why an episode ended. Exactly one per trajectory."""

    TERMINATED = "terminated"  # the env reached a terminal state (goal or failure)
    TRUNCATED_TURNS = "truncated_turns"  # the turn limit was reached
    TRUNCATED_CONTEXT = "truncated_context"  # the conversation no longer fits the context budget
    ENV_ERROR = "env_error"  # the env raised; the episode is kept for inspection but not trained on

    @property
    def truncated(self) -> bool:
        return self in (Termination.TRUNCATED_TURNS, Termination.TRUNCATED_CONTEXT)


@dataclass
class Turn:
    """One model response and the env's reply to it.

    ``prompt_ids`` are the exact token ids the engine conditioned on *before* this response:
    with the ``per_step`` context strategy the whole rebuilt prompt; with ``full`` only the ids appended
    since the previous response (template tokens + observation). ``response_ids`` and ``logprobs`` are
    aligned one to one; ``logprobs`` are the behaviour logprobs the engine sampled with.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    observation: str  # the observation text the model answered
    response_text: str
    actions: list[str] = field(default_factory=list)  # actions parsed from the response (may be empty)
    valid: bool = True  # False when the response held no valid action
    reward: float = 0.0  # total reward the env paid for this turn (sum of components)
    reward_components: dict[str, float] = field(default_factory=dict)
    anchor: str | None = None  # anchor-state key of the state the model acted in
    finish_reason: str = "stop"  # "stop" (stop token/string) or "length" (hit the per-turn token limit)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Trajectory:
    """One episode: the turns in order plus how and why it ended."""

    env_id: str
    seed: int
    turns: list[Turn] = field(default_factory=list)
    termination: Termination = Termination.TRUNCATED_TURNS
    success: bool = False  # the env's verifier says the task was solved
    group_index: int = 0  # which group (task) this trajectory belongs to
    policy_version: int = 0  # engine weight version that produced every turn
    error: str | None = None  # message when termination == ENV_ERROR
    context: str = "per_step"  # context strategy that produced the token ids

    @property
    def total_reward(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def reward_components(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for t in self.turns:
            for k, v in t.reward_components.items():
                out[k] = out.get(k, 0.0) + float(v)
        return out

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def valid_fraction(self) -> float:
        return sum(t.valid for t in self.turns) / max(1, len(self.turns))


@dataclass
class TrajectoryGroup:
    """Copies of one task (same env id and seed) rolled out under the same policy."""

    env_id: str
    seed: int
    trajectories: list[Trajectory] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [t.total_reward for t in self.trajectories]


@dataclass
class TrainSample:
    """One row the learner trains on.

    All lists have the same length (the sequence length). ``loss_mask`` is 1 exactly on the model's own
    tokens (responses); observation, template and prompt tokens are 0. ``behaviour_logprobs`` and
    ``advantages`` are meaningful only where ``loss_mask`` is 1 and are 0 elsewhere.
    """

    input_ids: list[int]
    loss_mask: list[int]
    behaviour_logprobs: list[float]
    advantages: list[float]
    traj_index: int = 0  # index into the batch's trajectory list
    turn_index: int = -1  # -1 for a whole-conversation sample (``full``), else the turn it covers

    def __len__(self) -> int:
        return len(self.input_ids)
