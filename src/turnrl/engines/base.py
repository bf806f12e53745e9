"""The engine protocol: token ids in, token ids and behaviour logprobs out.

The collector never knows which backend it drives. Every backend returns, for each prompt, the
sampled token ids and the logprob of each sampled token under the distribution it sampled from
(``softmax(logits / temperature)``; top-p / top-k filtering changes which tokens can be drawn but the
logprob reported is the temperature-scaled one the learner recomputes), plus the weight version that
produced it.

Engines that keep state per episode also implement :class:`SessionEngine` (``open``/``agenerate``/``close``);
the collector then runs each episode as a coroutine against its own session.
"""

from __future__ import annotations

import random
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


def written(tokenizer, action: str, params: SamplingParams, version: int) -> Completion:
    """``action`` as the model would write it: its tokens (no special tokens) and EOS, cut to ``max_new_tokens``
    (``finish_reason`` "length" when it did not fit one turn); behaviour logprobs 0. How scripted players (an oracle, a
    fixed rule) answer through the same collector as the model."""
    ids = tokenizer.encode(action, add_special_tokens=False) + [tokenizer.eos_token_id]
    finish = "length" if len(ids) > params.max_new_tokens else "stop"
    ids = ids[: params.max_new_tokens]
    return Completion(ids, [0.0] * len(ids), finish, version)


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


@runtime_checkable
class SessionEngine(Engine, Protocol):
    """An engine with sessions: one engine sequence held for an episode's lifetime.

    A session is opened when an episode starts and closed when it ends. Every turn sends the session's *full*
    prompt; the engine keeps what the session computed (its KV cache) between turns and reuses the longest prefix
    of the new prompt it already holds, so a growing conversation is never prefilled again. Requests of different
    sessions are awaited concurrently and the engine batches whatever is in flight (continuous batching).
    ``generate`` still works, each prompt in a session of its own. ``isinstance(engine, SessionEngine)`` checks
    that the methods exist, not their signatures.
    """

    def open(self, sample_key: tuple[int, ...] | None = None) -> int:
        """Open a session; returns its handle. ``sample_key`` (the collector passes (task seed, episode index))
        seeds what the session samples, so it does not depend on which other sessions share its batches."""
        ...

    async def agenerate(self, key: int, prompt: list[int], params: SamplingParams) -> Completion:
        """Complete ``prompt`` (token ids) in session ``key``; one request per session in flight at a time."""
        ...

    def close(self, key: int) -> None:
        """End session ``key`` and free what it holds. Closing an unknown or closed handle does nothing."""
        ...


class SeedStreamState:
    """Checkpoint state of an engine whose sampling state is one ``random.Random`` stream of per-request seeds.

    A mixin: the engine sets ``self.version`` (weight syncs) and ``self.rng`` (the seed stream) and gets
    :meth:`state_dict` / :meth:`load_state_dict` for both, so a resumed run draws the same seeds.
    """

    version: int
    rng: random.Random

    def state_dict(self) -> dict[str, Any]:
        """``{"version": int, "rng": random.Random.getstate()}``."""
        return {"version": self.version, "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (the rng state's inner sequence may have become a list)."""
        self.version = int(state["version"])
        rng = state["rng"]
        self.rng.setstate((rng[0], tuple(rng[1]), rng[2]))
