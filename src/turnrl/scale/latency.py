"""A simulated slow tool: every env step waits ``latency_ms`` first, as a web, search or SQL call would.

Use it as the env of a run, around any registered env::

    env.id: turnrl.scale.latency:slow_env
    env.kwargs: {env: frozenlake-v0, latency_ms: 200}

The wait is a network-style wait: ``astep`` sleeps without blocking the event loop, so the collector's other
episodes (and generation) go on meanwhile, and the sync ``step`` sleeps in the calling thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from turnrl.envs import Env, Wrapper, spec
from turnrl.envs.registry import WRAPPER_KWARGS


class Latency(Wrapper):
    """Waits ``seconds`` before each step of the wrapped env; everything else is the wrapped env's."""

    def __init__(self, env: Env, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"latency_ms={seconds * 1000:g} must be >= 0")
        super().__init__(env)
        self.seconds = seconds

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        time.sleep(self.seconds)
        return super().step(action_text)

    async def astep(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        await asyncio.sleep(self.seconds)
        return await super().astep(action_text)


def slow_env(env: str = "frozenlake-v0", latency_ms: float = 200.0, **kwargs: Any) -> Env:
    """The registered env ``env`` built with ``kwargs`` (its own class, without the standard wrappers: ``make``
    adds them around this), each step delayed by ``latency_ms``."""
    inner = spec(env)
    defaults = {k: v for k, v in inner.kwargs.items() if k not in WRAPPER_KWARGS}
    return Latency(inner.load()(**{**defaults, **kwargs}), latency_ms / 1000)
