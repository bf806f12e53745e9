"""Context strategies: what the model is shown each turn of an episode, as exact token ids.

Three strategies (DESIGN.md, "Token-in, token-out"; docs/memory.md for ``budgeted``):

- ``per_step``: every turn's prompt is rebuilt from the instructions, optional few-shot exchanges, the last
  ``history_turns`` exchanges and the current observation. Each turn is its own training sample; context
  stays flat however long the episode is.
- ``full``: one growing conversation. After each response the ids that close the assistant turn, add the
  observation and reopen the next assistant turn are appended (:meth:`ChatRenderer.full_continuation`),
  never a re-tokenization of decoded text, so the conversation is exactly what the engine conditioned on.
- ``budgeted``: rebuilt each turn like ``per_step`` from every exchange since the start (or since the last summary),
  fitted to a soft budget of ``budget_tokens``: while the prompt (without its budget line) is longer, the oldest
  shown exchange is dropped for the rest of the episode (the truncation baseline). A turn the agent spent on
  ``compress: SUMMARY`` (:mod:`turnrl.agent.memory`) replaces every earlier exchange: it stays pinned after the head,
  its observation shortened to a marker, its response (the summary, the agent's own words) kept, and it is never
  dropped. The current observation ends with a line ``[context: L of B tokens left]``, L being the budget minus
  the prompt without that line, so the policy sees its remaining budget in the ids it conditions on.

Both show an observation longer than ``max_observation_tokens`` cut to that many tokens (:meth:`ChatRenderer.cut`,
which never tokenizes the whole of a huge text); the context keeps the original length so the turn can record it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from turnrl.agent.chat import ChatRenderer


@dataclass(frozen=True)
class ContextSpec:
    strategy: str = "per_step"  # "per_step" | "full" | "budgeted"
    history_turns: int = 0  # per_step: previous exchanges kept in the prompt
    few_shot: bool = True  # the env's example exchanges open every prompt
    max_context_tokens: int = 2048  # a prompt that no longer fits (with the response budget) truncates the episode
    max_observation_tokens: int = 2048  # a longer observation is cut to this many tokens, and the cut recorded
    budget_tokens: int = 0  # budgeted: the soft prompt budget past which the oldest exchanges are dropped

    def __post_init__(self) -> None:
        if self.strategy not in ("per_step", "full", "budgeted"):
            raise ValueError(f"context strategy must be 'per_step', 'full' or 'budgeted', got {self.strategy!r}")
        if self.strategy == "budgeted" and not 0 < self.budget_tokens <= self.max_context_tokens:
            raise ValueError(f"the budgeted context needs 0 < budget_tokens <= max_context_tokens ({self.max_context_tokens}), "
                             f"got {self.budget_tokens}: set rollout.budget_tokens")
        if self.max_observation_tokens < 1:
            raise ValueError(f"max_observation_tokens must be >= 1, got {self.max_observation_tokens}")


@dataclass
class EpisodeContext:
    """One episode's context: the next prompt, and what a turn records as its ``prompt_ids``."""

    spec: ContextSpec
    renderer: ChatRenderer
    observation: str  # the observation the next response answers (cut to ``spec.max_observation_tokens``)
    observation_cut: int | None = None  # the observation's length in characters before it was cut; None if uncut
    history: list[tuple[str, str]] = field(default_factory=list)  # (observation, response text) of past turns
    conversation: list[int] = field(default_factory=list)  # full: every id up to the last response
    pending: list[int] = field(default_factory=list)  # full: ids appended since the last response
    first: int = 0  # budgeted: index (in ``history``) of the oldest exchange still shown after the summary
    summary_turn: int | None = None  # budgeted: the turn whose summary replaced every earlier one
    budget_left: int = 0  # budgeted: the budget minus the next prompt without its budget line
    fitted: list[int] = field(default_factory=list)  # budgeted: the next prompt

    def __post_init__(self) -> None:
        self._show(self.observation)
        if self.spec.strategy == "full":
            self.pending = self.renderer.full_initial_prompt(self.observation)
        elif self.spec.strategy == "budgeted":
            self._fit()

    def prompt(self) -> list[int]:
        """The ids the engine conditions on for the next response."""
        if self.spec.strategy == "full":
            return self.conversation + self.pending
        if self.spec.strategy == "budgeted":
            return list(self.fitted)
        k = self.spec.history_turns
        return self.renderer.per_step_prompt(self.observation, self.history[-k:] if k else [])

    def turn_prompt_ids(self, prompt: list[int]) -> list[int]:
        """What the turn answering ``prompt`` records: the whole prompt (per_step, budgeted) or the ids new since the last
        response (full)."""
        return list(self.pending) if self.spec.strategy == "full" else list(prompt)

    def advance(self, response_ids: list[int], response_text: str, observation: str, eos_token_id: int | None,
                summary: bool = False) -> None:
        """The model answered with ``response_ids`` and the env replied with ``observation``; ``summary``: the
        response was a ``compress`` summary, which replaces every earlier exchange under ``budgeted``."""
        self.history.append((self.observation, response_text))
        self._show(observation)
        if self.spec.strategy == "full":
            ended_eos = bool(response_ids) and response_ids[-1] == eos_token_id
            self.conversation = self.conversation + self.pending + list(response_ids)
            self.pending = self.renderer.full_continuation(self.observation, ended_eos)
        elif self.spec.strategy == "budgeted":
            if summary:
                self.summary_turn, self.first = len(self.history) - 1, len(self.history)
            self._fit()

    def record(self) -> dict[str, dict[str, int | None]]:
        """What a turn answering the next prompt records of it in ``Turn.info`` (``budgeted`` only): ``{"context":
        {"summary": the summary's turn or None, "first": the oldest exchange shown after it, "budget_left": L}}`` (0-based
        turn indices).
        Turns before ``summary`` are replaced by it; turns from ``summary + 1`` (or 0) up to ``first`` are dropped."""
        if self.spec.strategy != "budgeted":
            return {}
        return {"context": {"summary": self.summary_turn, "first": self.first, "budget_left": self.budget_left}}

    def _shown(self) -> list[tuple[str, str]]:
        """budgeted: the exchanges in the next prompt: the pinned summary (if any), then the ones kept."""
        pinned = []
        if self.summary_turn is not None:
            marker = f"(turns 1-{self.summary_turn + 1}, replaced by your summary)"
            pinned = [(marker, self.history[self.summary_turn][1])]
        return pinned + self.history[self.first :]

    def _fit(self) -> None:
        """budgeted: drop the oldest kept exchanges while the prompt without its budget line exceeds the budget, then
        build the prompt with the line. Dropped exchanges stay dropped: ``first`` only grows."""
        budget = self.spec.budget_tokens
        size = len(self.renderer.per_step_prompt(self.observation, self._shown()))
        while size > budget and self.first < len(self.history):
            self.first += 1
            size = len(self.renderer.per_step_prompt(self.observation, self._shown()))
        self.budget_left = budget - size
        line = f"[context: {max(0, self.budget_left)} of {budget} tokens left]"
        self.fitted = self.renderer.per_step_prompt(f"{self.observation}\n{line}", self._shown())

    def _show(self, observation: str) -> None:
        """Make ``observation`` (cut to the token cap) the one the next response answers."""
        self.observation = self.renderer.cut(observation, self.spec.max_observation_tokens)
        self.observation_cut = len(observation) if self.observation != observation else None
