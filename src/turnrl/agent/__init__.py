"""How an LLM meets an env: chat rendering (:mod:`~turnrl.agent.chat`), context strategies
(:mod:`~turnrl.agent.context`), both exact token-in, token-out, and memory actions (:mod:`~turnrl.agent.memory`)."""

from turnrl.agent.chat import ChatRenderer
from turnrl.agent.context import ContextSpec, EpisodeContext

__all__ = ["ChatRenderer", "ContextSpec", "EpisodeContext"]
