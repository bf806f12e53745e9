"""Context strategies: what the model is shown each turn of an episode, as exact token ids.

Two strategies (DESIGN.md, "Token-in, token-out"):

- ``per_step``: every turn's prompt is rebuilt from the instructions, optional few-shot exchanges, the last
  ``history_turns`` exchanges and the current observation. Each turn is its own training sample; context
  stays flat however long the episode is.
- ``full``: one growing conversation. After each response the ids that close the assistant turn, add the
  observation and reopen the next assistant turn are appended (:meth:`ChatRenderer.full_continuation`),
  never a re-tokenization of decoded text, so the conversation is exactly what the engine conditioned on.

Both show an observation longer than ``max_observation_tokens`` cut to that many tokens (:meth:`ChatRenderer.cut`,
which never tokenizes the whole of a huge text); the context keeps the original length so the turn can record it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from turnrl.agent.chat import ChatRenderer


@dataclass(frozen=True)
class ContextSpec:
    strategy: str = "per_step"  # "per_step" | "full"
    history_turns: int = 0  # per_step: previous exchanges kept in the prompt
    few_shot: bool = True  # the env's example exchanges open every prompt
    max_context_tokens: int = 2048  # a prompt that no longer fits (with the response budget) truncates the episode
    max_observation_tokens: int = 2048  # a longer observation is cut to this many tokens, and the cut recorded

    def __post_init__(self) -> None:
        if self.strategy not in ("per_step", "full"):
            raise ValueError(f"context strategy must be 'per_step' or 'full', got {self.strategy!r}")
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

    def __post_init__(self) -> None:
        self._show(self.observation)
        if self.spec.strategy == "full":
            self.pending = self.renderer.full_initial_prompt(self.observation)

    def prompt(self) -> list[int]:
        """The ids the engine conditions on for the next response."""
        if self.spec.strategy == "full":
            return self.conversation + self.pending
        k = self.spec.history_turns
        return self.renderer.per_step_prompt(self.observation, self.history[-k:] if k else [])

    def turn_prompt_ids(self, prompt: list[int]) -> list[int]:
        """What the turn answering ``prompt`` records: the whole prompt (per_step) or the ids new since the last response (full)."""
        return list(self.pending) if self.spec.strategy == "full" else list(prompt)

    def advance(self, response_ids: list[int], response_text: str, observation: str, eos_token_id: int | None) -> None:
        """The model answered with ``response_ids`` and the env replied with ``observation``."""
        self.history.append((self.observation, response_text))
        self._show(observation)
        if self.spec.strategy == "full":
            ended_eos = bool(response_ids) and response_ids[-1] == eos_token_id
            self.conversation = self.conversation + self.pending + list(response_ids)
            self.pending = self.renderer.full_continuation(self.observation, ended_eos)

    def _show(self, observation: str) -> None:
        """Make ``observation`` (cut to the token cap) the one the next response answers."""
        self.observation = self.renderer.cut(observation, self.spec.max_observation_tokens)
        self.observation_cut = len(observation) if self.observation != observation else None
