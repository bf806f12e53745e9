"""How an LLM meets an env: chat rendering (:mod:`~turnrl.agent.chat`) and context strategies
(:mod:`~turnrl.agent.context`), both exact token-in, token-out."""

from turnrl.agent.chat import ChatRenderer
from turnrl.agent.context import ContextSpec, EpisodeContext

__all__ = ["ChatRenderer", "ContextSpec", "EpisodeContext"]
