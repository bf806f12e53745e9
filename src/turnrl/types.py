"""Typed records that flow through turnrl. No behaviour lives here beyond small derived views.

Terms follow DESIGN.md:

- a **turn** is one model response and the environment's reply to it;
- **terminated** means the env reached a terminal state (goal, failure); **truncated** means a limit
  stopped the episode (turns, tokens, context). A critic bootstraps on truncation only;
- the **outcome reward** is what the env's verifier pays at the end; **step rewards** are paid per
  turn; format / invalid-action penalties are separate named components;
- a **group** is copies of one task (same seed) rolled out under the same policy;
- **behaviour logprobs** are the logprobs the engine sampled with;
- a **task key** is what makes two tasks the same (map layout, puzzle, question id, product, program): held-out
  sets are disjoint from training by task key, not by seed;
- **advantages** are an estimator's credit for a batch (:class:`Advantages`).
"""

from __future__ import annotations

from collections.abc import Callable
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
    version: int = 0  # policy version: the engine weight version that sampled this response (Completion.version)


@dataclass
class Trajectory:
    """One episode: the turns in order plus how and why it ended."""

    env_id: str
    seed: int
    turns: list[Turn] = field(default_factory=list)
    termination: Termination = Termination.TRUNCATED_TURNS
    success: bool = False  # the env's verifier says the task was solved
    group_index: int = 0  # which group (task) this trajectory belongs to
    policy_version: int = 0  # engine weight version of the last turn; each turn keeps its own (Turn.version)
    error: str | None = None  # message when termination == ENV_ERROR; also records a close() that failed after any ending
    context: str = "per_step"  # context strategy that produced the token ids
    task_key: str | None = None  # what makes two tasks the same (Env.task_key()); None if the env gave none
    agent: str | None = None  # multi-agent envs: the role whose turns these are (one trajectory per role and episode)
    team_return: float | None = None  # multi-agent envs: the episode's mean return over its roles (credit/multiagent.py)

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
    tokens (responses); observation, template and prompt tokens are 0. ``behaviour_logprobs``,
    ``advantages`` and ``policy_versions`` are meaningful only where ``loss_mask`` is 1 and are 0 elsewhere;
    ``policy_versions`` is empty for a sample no engine sampled (a demonstration).
    """

    input_ids: list[int]
    loss_mask: list[int]
    behaviour_logprobs: list[float]
    advantages: list[float]
    traj_index: int = 0  # index into the batch's trajectory list
    turn_index: int = -1  # -1 for a whole-conversation sample (``full``), else the turn it covers
    policy_versions: list[int] = field(default_factory=list)  # per token: the version that sampled it (Turn.version)
    agent: str | None = None  # multi-agent envs: the role whose turns these are (Trajectory.agent); per-role policies route on it

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class Advantages:
    """An estimator's credit for a batch, in flattened group order ``[t for g in groups for t in g.trajectories]``.

    ``turns[i][j]`` is the advantage of turn ``j`` of trajectory ``i``; the learner gives it to every response
    token of that turn. Token-level estimators (``ppo_token``, ``ppo_bilevel``) also set ``tokens[i][j]``, one
    value per response token (``len == len(turn.response_ids)``), which the learner uses instead; their
    ``turns[i][j]`` is then the mean over the turn's tokens (0 for an empty response), a summary for display.
    Read per-token values with :meth:`token_values`, so no reader asks which kind it holds.
    """

    turns: list[list[float]]
    tokens: list[list[list[float]]] | None = None

    @classmethod
    def per_token(cls, tokens: list[list[list[float]]]) -> "Advantages":
        """From per-token values; ``turns`` becomes each turn's mean."""
        turns = [[sum(t) / len(t) if t else 0.0 for t in traj] for traj in tokens]
        return cls(turns, tokens)

    @classmethod
    def zeros(cls, trajectories: "list[Trajectory]") -> "Advantages":
        return cls([[0.0] * len(t.turns) for t in trajectories])

    def __len__(self) -> int:
        return len(self.turns)

    def token_values(self, i: int, j: int, n: int) -> list[float]:
        """The advantage of each of the ``n`` response tokens of turn ``j`` of trajectory ``i``."""
        if self.tokens is None:
            return [float(self.turns[i][j])] * n
        values = self.tokens[i][j]
        if len(values) != n:
            raise ValueError(f"trajectory {i} turn {j}: {len(values)} token advantages for a {n}-token response")
        return [float(x) for x in values]

    def values(self) -> list[float]:
        """Every value at the estimator's own granularity (per token when ``tokens`` is set), for statistics."""
        if self.tokens is not None:
            return [float(x) for traj in self.tokens for turn in traj for x in turn]
        return [float(a) for traj in self.turns for a in traj]

    def rows(self, indices: list[int]) -> "Advantages":
        """The advantages of trajectories ``indices`` only, in that order."""
        tokens = [self.tokens[i] for i in indices] if self.tokens is not None else None
        return Advantages([self.turns[i] for i in indices], tokens)

    def masked(self, keep: Callable[[int, int], bool]) -> "Advantages":
        """A copy with every turn ``(i, j)`` for which ``keep(i, j)`` is False set to 0 (its tokens too)."""
        turns = [[a if keep(i, j) else 0.0 for j, a in enumerate(traj)] for i, traj in enumerate(self.turns)]
        if self.tokens is None:
            return Advantages(turns)
        tokens = [[list(t) if keep(i, j) else [0.0] * len(t) for j, t in enumerate(traj)] for i, traj in enumerate(self.tokens)]
        return Advantages(turns, tokens)
