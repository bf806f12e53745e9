"""The engine protocol: token ids in, token ids and behaviour logprobs out.

The collector never knows which backend it drives. Every backend returns, for each prompt, the
sampled token ids and the logprob of each sampled token under the distribution it sampled from
(``softmax(logits / temperature)``; top-p / top-k filtering changes which tokens can be drawn but the
logprob reported is the temperature-scaled one the learner recomputes), plus the weight version that
produced it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()  # in addition to the engine's end-of-turn tokens
    stop_strings: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (stop token or string) | "length" (hit max_new_tokens)
    version: int = 0  # weight version that produced every token
    stats: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """A generation backend. ``version`` counts weight syncs."""

    version: int

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Complete each prompt (a list of token ids). Output order matches input order."""
        ...

    def sync_weights(self) -> None:
        """Make the engine sample from the learner's current weights; bumps ``version``."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """RNG and version state, so a resumed run samples exactly as an uninterrupted one."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
